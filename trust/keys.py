"""The node's signing key and its trust policy, in /etc/gpuckpt: whose checkpoints this node restores.

`node.key`: this node's Ed25519 private key (PEM, root only; made by `gpuckpt install`).
`trust.toml`: the public keys of the nodes it trusts, by name, and the sources from which it
accepts unsigned checkpoints (each use logged). This node's own key is always trusted. Both
files are read only if root owns them and no one else may write them (the key: read them).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import ErrorDetails

from ..errors import ConfigError
from ..host.safefiles import create_new, replace_file
from ..node.config import validated_toml
from ..oci.timestamps import utc_now
from .signature import SignatureError, Signer, TrustedKey, key_id_of, parse_public_key

DEFAULT_TRUST_DIR = "/etc/gpuckpt"
TRUST_DIR_ENV = "GPUCKPT_TRUST_DIR"
DEFAULT_TRUST_LOG = "/var/log/gpuckpt/trust.log"
TRUST_LOG_ENV = "GPUCKPT_TRUST_LOG"
NODE_KEY_FILE = "node.key"
POLICY_FILE = "trust.toml"
THIS_NODE = "this-node"  # the name of this node's own key in every listing
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_POLICY_BYTES = 1 << 20
MAX_KEY_FILE_BYTES = 4096
# Where unsigned input may come from: an archive file given to `gpuckpt import` (archive:FILE), every
# archive under a directory (archive:/DIR/), or the shim's restore of an image directory it finds unsigned:
RESTORE_SOURCES = ("restore:any",)


def trust_dir() -> str:
    return os.environ.get(TRUST_DIR_ENV) or DEFAULT_TRUST_DIR


def node_key_path() -> str:
    return os.path.join(trust_dir(), NODE_KEY_FILE)


def policy_path() -> str:
    return os.path.join(trust_dir(), POLICY_FILE)


def trust_log_path() -> str:
    return os.environ.get(TRUST_LOG_ENV) or DEFAULT_TRUST_LOG


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeyEntry(_Section):
    """A trusted node's public key, as `gpuckpt trust export-key` printed it there."""

    name: str = Field(pattern=NAME_PATTERN)
    public_key: str = Field(max_length=1024)
    added: str = ""

    @field_validator("public_key")
    @classmethod
    def _is_a_key(cls, value: str) -> str:
        try:
            parse_public_key(value, "public_key")
        except SignatureError as error:
            raise ValueError(str(error).removeprefix("public_key: ")) from None
        return value


class UnsignedSource(_Section):
    """An explicit exception: unsigned checkpoints from `source` are restored (and logged)."""

    source: str = Field(max_length=4096)
    note: str = Field(default="", max_length=400)

    @field_validator("source")
    @classmethod
    def _is_a_source(cls, value: str) -> str:
        return checked_source(value)


class TrustPolicy(_Section):
    schema_version: Literal[1] = 1
    key: list[KeyEntry] = []
    allow_unsigned: list[UnsignedSource] = []

    @field_validator("key")
    @classmethod
    def _unique(cls, keys: list[KeyEntry]) -> list[KeyEntry]:
        names = [key.name for key in keys]
        if len(set(names)) != len(names) or THIS_NODE in names:
            raise ValueError(f"key names must be unique and not {THIS_NODE!r}")
        return keys


def checked_source(value: str) -> str:
    """`archive:/ABSOLUTE/PATH` (that file, or every archive under that directory) or `restore:any`."""
    if value in RESTORE_SOURCES:
        return value
    path = value.removeprefix("archive:")
    absolute = path != value and path.startswith("/") and "\0" not in path
    if not absolute or (path != "/" and os.path.normpath(path) != path.rstrip("/")):
        raise ValueError(f"source {value[:200]!r}: give archive:/ABSOLUTE/PATH (a file, or a directory for every "
                         f"archive under it) or {' or '.join(RESTORE_SOURCES)}")
    return value


def _describe(error: ErrorDetails) -> str:
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {key!r} (allowed: schema_version, [[key]] name/public_key/added, " \
               "[[allow_unsigned]] source/note)"
    return f"key {key!r}: {error['msg'].removeprefix('Value error, ')}"


def _read_root_file(path: str, limit: int, private: bool) -> bytes | None:
    """The bytes of a file root must trust: None if absent; refused unless root owns it and no one
    else may write it (`private`: or read it). Never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    with os.fdopen(fd, "rb") as source:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise ConfigError(f"{path}: not a regular file")
        loose = status.st_mode & (0o077 if private else 0o022)
        if os.geteuid() == 0 and (status.st_uid != 0 or loose):
            who = "readable and writable by root only (0600)" if private else "writable by root only"
            raise ConfigError(f"{path}: must be owned by root and {who}")
        data = source.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{path}: larger than {limit} bytes")
    return data


def parse_policy(text: str, source: str) -> TrustPolicy:
    return validated_toml(text, source, TrustPolicy, lambda errors: _describe(errors[0]))


def load_policy(path: str | None = None) -> TrustPolicy:
    """The trust policy; an empty one (only this node's key, nothing unsigned) where none exists."""
    path = path or policy_path()
    data = _read_root_file(path, MAX_POLICY_BYTES, private=False)
    if data is None:
        return TrustPolicy()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_policy(text, path)


POLICY_HEADER = """\
# gpuckpt trust policy (see README: Signed checkpoints). Edited by `gpuckpt trust`; hand edits are kept
# only as values. [[key]]: public keys of nodes whose signed checkpoints this node restores
# (this node's own key, node.key beside this file, is always trusted). [[allow_unsigned]]:
# sources from which UNSIGNED checkpoints are restored anyway; every use is logged.
"""


def render_policy(policy: TrustPolicy) -> str:
    import tomlkit  # deferred: the shim reads this policy at every checkpoint and restore; only `gpuckpt trust` writes

    document = tomlkit.document()
    document.add("schema_version", policy.schema_version)
    if policy.key:
        document.add("key", [entry.model_dump() for entry in policy.key])
    if policy.allow_unsigned:
        document.add("allow_unsigned", [entry.model_dump() for entry in policy.allow_unsigned])
    return POLICY_HEADER + tomlkit.dumps(document)


def save_policy(policy: TrustPolicy, path: str | None = None) -> str:
    """Write the policy at once for any reader (beside it, then renamed), 0644: public keys only."""
    path = path or policy_path()
    text = render_policy(policy)
    parse_policy(text, path)  # what we write, we can read
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    replace_file(path, text, mode=0o644)
    return path


def load_node_key(path: str | None = None) -> Signer | None:
    """This node's signing key; None if it has none yet (`gpuckpt install` makes it)."""
    path = path or node_key_path()
    pem = _read_root_file(path, MAX_KEY_FILE_BYTES, private=True)
    if pem is None:
        return None
    try:
        return Signer.from_pem(pem, path)
    except SignatureError as error:
        raise ConfigError(str(error)) from None


def require_node_key() -> Signer:
    signer = load_node_key()
    if signer is None:
        raise ConfigError(f"{node_key_path()}: this node has no signing key: run `gpuckpt install --engine podman` "
                          "(or docker) as root to make one")
    return signer


def ensure_node_key(path: str | None = None) -> tuple[Signer, bool]:
    """This node's key, made if missing (0600, created new: nothing planted there lends it a mode);
    whether it was made now."""
    path = path or node_key_path()
    if (signer := load_node_key(path)) is not None:
        return signer, False
    signer = Signer.generate()
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with os.fdopen(create_new(temporary), "wb") as out:
        out.write(signer.pem())
    try:
        os.link(temporary, path)  # never replaces a key made meanwhile
    except FileExistsError:
        os.unlink(temporary)
        return require_node_key(), False
    os.unlink(temporary)
    return signer, True


@dataclass(frozen=True)
class Trust:
    """What this node trusts, ready to verify with: keys by id, and the unsigned exceptions."""

    keys: dict[str, TrustedKey]
    policy: TrustPolicy
    node_key_id: str | None

    def unsigned_rule(self, source: str) -> UnsignedSource | None:
        """The operator's exception that covers `source` (an `archive:` real path or a `restore:` name)."""
        for rule in self.policy.allow_unsigned:
            if rule.source == source:
                return rule
            prefix = rule.source.rstrip("/") + "/"
            if rule.source.startswith("archive:") and source.startswith(prefix):
                return rule
        return None


def load_trust() -> Trust:
    policy = load_policy()
    keys = {key_id_of(public): TrustedKey(entry.name, public)
            for entry in policy.key for public in [parse_public_key(entry.public_key, entry.name)]}
    signer = load_node_key()
    if signer is not None:
        keys[signer.key_id] = TrustedKey(THIS_NODE, signer.public)
    return Trust(keys, policy, signer.key_id if signer else None)


def log_unsigned_use(rule: UnsignedSource, what: str, quiet: bool = False) -> None:
    """An unsigned checkpoint accepted under an exception: one JSON line in the trust log (root only)
    and, unless `quiet`, one line on stdout (stderr stays for the error, if one follows)."""
    if not quiet:
        print(f"gpuckpt: {what} is unsigned: accepted because {policy_path()} allows unsigned from {rule.source} "
              f"(logged in {trust_log_path()})")
    record = {"time": utc_now(), "event": "unsigned-accepted",
              "what": what, "source": rule.source, "note": rule.note, "pid": os.getpid()}
    log_path = trust_log_path()
    os.makedirs(os.path.dirname(log_path), mode=0o700, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as log_file:
        log_file.write(json.dumps(record) + "\n")


def read_key_text(path: str) -> str:
    """A public key file given to `gpuckpt trust add` ('-': stdin), bounded."""
    if path == "-":
        text = sys.stdin.read(MAX_KEY_FILE_BYTES + 1)
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
        with os.fdopen(fd, "rb") as source:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError(f"{path}: not a regular file")
            text = source.read(MAX_KEY_FILE_BYTES + 1).decode("utf-8", "replace")
    if len(text) > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_KEY_FILE_BYTES} bytes: not a public key")
    return text

