"""The shim's signature over a CRIU image directory: made at dump, checked at restore.

CRIU restores each process's credentials, seccomp, namespaces and mounts from the image files,
and runc its descriptors from descriptors.json: whoever can edit them chooses what the restored
processes hold. So the shim signs what it dumped (`gpuckpt-dump.sig`: every file's size, the
sha256 of every file but the memory pages) with the node key, and refuses to restore a directory
that is not exactly that, signed by a key the node trusts (its own included), whatever engine
moved it (podman --import, a checkpoint image, docker, a kubelet archive). An unsigned directory
(plain runc's dump) is restored only under the trust policy's `restore:any` (logged). Pages are
covered by the export signature (transfer.provenance) while they travel, not here: hashing GiBs at
every dump and restore would cost seconds.
"""

from __future__ import annotations

import hashlib
import os
import stat

from ..host.safefiles import read_bounded, replace_file
from ..oci.image_names import PAGES_FILE
from .keys import Trust, load_node_key, log_unsigned_use
from .signature import MAX_ENVELOPE_BYTES, SignatureError, SignedEntry, open_envelope, parse_envelope

DUMP_SIGNATURE = "gpuckpt-dump.sig"
# Written around a dump or restore by CRIU, runc or the engine, read by none of them at restore:
# neither signed nor required.
UNSIGNED_LOGS = frozenset({"dump.log", "restore.log", "stats-dump", "stats-restore", "lazy-pages.log"})
# CRIU's lazy-pages daemon listens here (in the directory it is given, the images' for runc's lazy
# migration) while a lazy restore takes the pages: a socket, the only non-file allowed, never signed.
LAZY_PAGES_SOCKET = "lazy-pages.socket"
MAX_IMAGE_FILES = 100_000


def _image_files(image_dir: str, what: str) -> dict[str, os.stat_result]:
    """The regular files of a CRIU image directory, by name; anything else there is refused (but CRIU's
    lazy-pages socket)."""
    files: dict[str, os.stat_result] = {}
    with os.scandir(image_dir) as listing:
        for entry in listing:
            status = entry.stat(follow_symlinks=False)
            if entry.name == LAZY_PAGES_SOCKET and stat.S_ISSOCK(status.st_mode):
                continue
            if not stat.S_ISREG(status.st_mode):
                raise SignatureError(f"{what}: {image_dir}/{entry.name} is not a regular file: refused "
                                     "(a checkpoint image directory holds only files)")
            files[entry.name] = status
            if len(files) > MAX_IMAGE_FILES:
                raise SignatureError(f"{what}: {image_dir} holds more than {MAX_IMAGE_FILES} files: refused")
    for name in (DUMP_SIGNATURE, *UNSIGNED_LOGS):
        files.pop(name, None)
    return files


def _file_sha256(path: str, size: int, what: str) -> str:
    """The sha256 of exactly `size` bytes of a regular file opened without following a link."""
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise SignatureError(f"{what}: {path}: cannot read: {error.strerror}") from None
    with os.fdopen(fd, "rb") as source:
        if os.fstat(fd).st_size != size:
            raise SignatureError(f"{what}: {path} changed while it was checked: refused")
        left = size
        while left and (piece := source.read(min(4 << 20, left))):
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def sign_dump(image_dir: str) -> str | None:
    """`gpuckpt-dump.sig` in a CRIU image directory the shim just dumped: every file's size, and the
    sha256 of every file but the memory pages (what CRIU and runc read to rebuild the processes:
    credentials, seccomp, namespaces, mounts, descriptors). None if this node has no key."""
    signer = load_node_key()
    if signer is None:
        return None
    entries = []
    for name, status in sorted(_image_files(image_dir, image_dir).items()):
        path = os.path.join(image_dir, name)
        digest = None if PAGES_FILE.fullmatch(name) else _file_sha256(path, status.st_size, image_dir)
        entries.append(SignedEntry(name=name, size=status.st_size, mode=status.st_mode & 0o777, sha256=digest))
    path = os.path.join(image_dir, DUMP_SIGNATURE)
    replace_file(path, signer.sign(signer.content("dump", entries)))
    return path


def verify_dump(image_dir: str, trust: Trust, what: str, vouched: str = "") -> tuple[str, bool]:
    """A CRIU image directory checked against its dump signature before anything restores from it;
    the line to log, and whether it was signed. A file not signed, missing, or of another size or
    content is a SignatureError; so is an unsigned directory, unless the trust policy allows
    `restore:any` (logged) or `vouched` says what verified it (gpuckpt import's record of the archive
    it came in: a dump that plain runc made travels unsigned in a signed or allowed archive)."""
    path = os.path.join(image_dir, DUMP_SIGNATURE)
    if not os.path.lexists(path) and vouched:
        return f"{what}: unsigned dump restored: {vouched}", False
    if not os.path.lexists(path):
        rule = trust.unsigned_rule("restore:any")
        if rule is None:
            raise SignatureError(f"{what}: {image_dir} has no {DUMP_SIGNATURE}: not dumped by gpuckpt-runtime on a "
                                 "node this one trusts: refused (to restore unsigned checkpoints: "
                                 "`gpuckpt trust allow-unsigned restore:any`)")
        log_unsigned_use(rule, f"{what} ({image_dir})", quiet=True)
        return f"{what}: unsigned checkpoint restored: the trust policy allows restore:any (logged)", False
    envelope = read_bounded(path, MAX_ENVELOPE_BYTES, path)
    content, signer = open_envelope(envelope, trust.keys, f"{what}: {path}", "dump")
    signed = {entry.name: entry for entry in content.entries}
    files = _image_files(image_dir, what)
    for name, status in files.items():
        entry = signed.get(name)
        if entry is None:
            raise SignatureError(f"{what}: {image_dir}/{name} is not among the files signed at dump: refused")
        if status.st_size != entry.size:
            raise SignatureError(f"{what}: {image_dir}/{name} has {status.st_size} bytes, signed {entry.size}: refused")
        if entry.sha256 is not None and _file_sha256(os.path.join(image_dir, name), entry.size, what) != entry.sha256:
            raise SignatureError(f"{what}: {image_dir}/{name} does not match its sha256 signed at dump: refused")
    missing = sorted(set(signed) - set(files))
    if missing:
        raise SignatureError(f"{what}: {image_dir} lacks {', '.join(missing[:3])}, signed at dump: refused")
    return (f"{what}: checkpoint signed at dump by {signer.name} (key {content.key_id}), {len(files)} files verified",
            True)


def dumped_here(image_dir: str, trust: Trust) -> bool:
    """Whether the dump in `image_dir`, verified by verify_dump before, was signed by this node's own key
    (not another trusted node's, not unsigned under restore:any)."""
    path = os.path.join(image_dir, DUMP_SIGNATURE)
    if trust.node_key_id is None or not os.path.lexists(path):
        return False
    return parse_envelope(read_bounded(path, MAX_ENVELOPE_BYTES, path), path).key_id == trust.node_key_id
