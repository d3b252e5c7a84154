"""`gpuckpt trust`: whose signed checkpoints this node restores, and from where unsigned ones.

init: make this node's signing key if it has none (what `gpuckpt install` does first);
add NAME FILE|- / remove NAME / list: trusted public keys (node.trust's trust.toml);
export-key: this node's public key, for the other node's `trust add`;
allow-unsigned SOURCE / disallow-unsigned SOURCE: the explicit exceptions, each use logged;
verify ARCHIVE|oci:DIR[:TAG]: check a signature without restoring anything.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from pydantic import ValidationError

from ..errors import UsageError
from ..oci.archive import decompressed, open_archive
from ..oci.image_layout import parse_target, read_layout, verify_layer
from ..oci.podman_archive import copy_checked
from ..oci.timestamps import utc_now
from ..trust.keys import (
    THIS_NODE,
    KeyEntry,
    TrustPolicy,
    UnsignedSource,
    checked_source,
    ensure_node_key,
    load_node_key,
    load_policy,
    load_trust,
    node_key_path,
    policy_path,
    read_key_text,
    require_node_key,
    save_policy,
)
from ..trust.provenance import ArchiveVerification, verify_archive_signature, verify_image_signature
from ..trust.signature import key_id_of, parse_public_key, public_key_line
from .output import TrustedKey, TrustList, TrustVerification, UnsignedException
from .transfer import require_archive_file


class Verb(NamedTuple):
    name: str
    help: str
    handler: Callable[[argparse.Namespace], int]
    arguments: tuple[tuple[str, dict[str, Any]], ...] = ()  # each: add_argument's name and keywords (of any type)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("trust", help="signing keys this node trusts, and its node key")
    verbs = parser.add_subparsers(dest="trust_command", required=True, metavar="VERB")
    for verb in VERBS:
        verb_parser = verbs.add_parser(verb.name, help=verb.help)
        for name, keywords in verb.arguments:
            verb_parser.add_argument(name, **keywords)
        verb_parser.set_defaults(handler=verb.handler)


def _edit(change: Callable[[TrustPolicy], TrustPolicy]) -> str:
    """Read, change and write the policy under an exclusive lock: two edits at once both land."""
    os.makedirs(os.path.dirname(policy_path()), mode=0o755, exist_ok=True)
    fd = os.open(f"{policy_path()}.lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return save_policy(change(load_policy()))
    finally:
        os.close(fd)


EntryT = TypeVar("EntryT", KeyEntry, UnsignedSource)


def _without(entries: list[EntryT], unwanted: Callable[[EntryT], bool], refusal: str) -> list[EntryT]:
    """The policy's entries less the unwanted ones; a UsageError saying `refusal` if none is."""
    kept = [entry for entry in entries if not unwanted(entry)]
    if len(kept) == len(entries):
        raise UsageError(refusal)
    return kept


def run_add(options: argparse.Namespace) -> int:
    public = parse_public_key(read_key_text(options.key_file), options.key_file)
    try:
        entry = KeyEntry(name=options.name, public_key=public_key_line(public),
                         added=utc_now())
    except ValidationError as error:
        raise UsageError(f"{options.name!r}: {error.errors()[0]['msg']}") from None
    key_id = key_id_of(public)

    def change(policy: TrustPolicy) -> TrustPolicy:
        for other in policy.key:
            if other.name == entry.name:
                raise UsageError(f"a key named {entry.name} is already trusted: "
                                 f"`gpuckpt trust remove {entry.name}` first")
            if key_id_of(parse_public_key(other.public_key, other.name)) == key_id:
                raise UsageError(f"key {key_id} is already trusted as {other.name}")
        return policy.model_copy(update={"key": [*policy.key, entry]})

    path = _edit(change)
    print(f"{path}: trusting key {key_id} as {entry.name}")
    return 0


def run_remove(options: argparse.Namespace) -> int:
    def change(policy: TrustPolicy) -> TrustPolicy:
        names = ", ".join(entry.name for entry in policy.key) or "none"
        refusal = f"no trusted key is named {options.name} (trusted: {names})"
        return policy.model_copy(update={"key": _without(policy.key, lambda key: key.name == options.name, refusal)})

    print(f"{_edit(change)}: key {options.name} no longer trusted")
    return 0


def run_allow_unsigned(options: argparse.Namespace) -> int:
    try:
        rule = UnsignedSource(source=checked_source(options.source), note=options.note)
    except ValueError as error:
        raise UsageError(str(error).splitlines()[-1].removeprefix("  Value error, ")) from None

    def change(policy: TrustPolicy) -> TrustPolicy:
        if any(other.source == rule.source for other in policy.allow_unsigned):
            raise UsageError(f"unsigned input from {rule.source} is already allowed")
        return policy.model_copy(update={"allow_unsigned": [*policy.allow_unsigned, rule]})

    print(f"{_edit(change)}: unsigned checkpoints from {rule.source} will be restored (each use logged)")
    return 0


def run_disallow_unsigned(options: argparse.Namespace) -> int:
    def change(policy: TrustPolicy) -> TrustPolicy:
        kept = _without(policy.allow_unsigned, lambda rule: rule.source == options.source,
                        f"no unsigned exception for {options.source}")
        return policy.model_copy(update={"allow_unsigned": kept})

    print(f"{_edit(change)}: unsigned checkpoints from {options.source} refused again")
    return 0


def run_init(options: argparse.Namespace) -> int:
    signer, made = ensure_node_key()
    print(f"{node_key_path()}: {'made' if made else 'kept'} this node's signing key {signer.key_id}")
    return 0


def run_export_key(options: argparse.Namespace) -> int:
    print(public_key_line(require_node_key().public, socket.gethostname()))
    return 0


def run_list(options: argparse.Namespace) -> int:
    signer, policy = load_node_key(), load_policy()
    keys = [TrustedKey(name=entry.name, key_id=key_id_of(parse_public_key(entry.public_key, entry.name)),
                       added=entry.added) for entry in policy.key]
    listed = TrustList(node_key_id=signer.key_id if signer else None, node_key_path=node_key_path(), keys=keys,
                       unsigned_allowed=[UnsignedException(source=rule.source, note=rule.note)
                                         for rule in policy.allow_unsigned],
                       policy_path=policy_path())
    if options.json:
        listed.print_json()
        return 0
    node_key = (f"{listed.node_key_id} ({listed.node_key_path})" if listed.node_key_id
                else "no node key (gpuckpt install)")
    print(f"{THIS_NODE}: {node_key}")
    for key in listed.keys:
        print(f"{key.name}: {key.key_id} (added {key.added or '?'})")
    for rule in listed.unsigned_allowed:
        print(f"UNSIGNED accepted from {rule.source}{' (' + rule.note + ')' if rule.note else ''}")
    print(f"policy: {listed.policy_path}")
    return 0


def run_verify(options: argparse.Namespace) -> int:
    image = parse_target(options.target)
    if image is None:
        require_archive_file(options.target)  # a missing archive said "no signature"
    trust = load_trust()
    if image is not None:
        layout = read_layout(*image)
        signed = verify_image_signature(layout.manifest, trust, options.target)
        verify_layer(layout)
        verified = TrustVerification(target=options.target, signed=signed is not None, layer_digest=layout.layer.digest)
        if signed is not None:
            verified = verified.model_copy(update={"signer": signed[1], "key_id": signed[0].key_id,
                                                   "signed_at": signed[0].created})
    else:
        verification = verify_archive_signature(options.target, trust, options.signature)
        with open_archive(options.target) as raw:
            copy_checked(decompressed(verification.reader(raw)), None, options.target, observe=verification.observe)
            verification.finish()
        verified = TrustVerification(target=options.target, signed=False)
        if isinstance(verification, ArchiveVerification):
            verified = verified.model_copy(update={
                "signed": True, "signer": verification.signer_name, "key_id": verification.content.key_id,
                "signed_at": verification.content.created, "entries": len(verification.content.entries)})
    if options.json:
        verified.print_json()
    elif not verified.signed:
        print(f"{options.target}: unsigned, allowed by the trust policy")
    elif verified.layer_digest:
        print(f"{options.target}: signed by {verified.signer} (key {verified.key_id}, {verified.signed_at}); "
              f"layer {verified.layer_digest} verified")
    else:
        print(f"{options.target}: signed by {verified.signer} (key {verified.key_id}, {verified.signed_at}); "
              f"{verified.entries} entries and the archive verified")
    return 0


JSON = ("--json", {"action": "store_true", "help": "as JSON (docs/cli-output.md)"})
# The verbs in --help's order (here, below the handlers they name).
VERBS = (
    Verb("init", "make this node's signing key if it has none (gpuckpt install does)", run_init),
    Verb("add", "trust checkpoints signed by another node's key", run_add, (
        ("name", {"help": "a name for that node (letters, digits, '.', '_', '-')"}),
        ("key_file", {"metavar": "PUBKEYFILE|-", "help": "what `gpuckpt trust export-key` printed there"}))),
    Verb("remove", "stop trusting a key", run_remove, (("name", {}),)),
    Verb("list", "this node's key, the trusted keys, the unsigned exceptions", run_list, (JSON,)),
    Verb("export-key", "print this node's public key (for the other node's trust add)", run_export_key),
    Verb("allow-unsigned", "accept unsigned checkpoints from a source (logged)", run_allow_unsigned, (
        ("source", {"help": "archive:/PATH (that archive, or every one under that directory) or restore:any"}),
        ("--note", {"default": "", "help": "why, for whoever reads the policy"}))),
    Verb("disallow-unsigned", "remove an unsigned exception", run_disallow_unsigned, (("source", {}),)),
    Verb("verify", "check an archive's or checkpoint image's signature", run_verify, (
        ("target", {"help": "ARCHIVE (its ARCHIVE.sig beside it) or oci:DIR[:TAG]"}),
        ("--signature", {"metavar": "FILE", "help": "the archive's signature (default: ARCHIVE.sig)"}), JSON)),
)
