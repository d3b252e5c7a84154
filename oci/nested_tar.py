"""The tars inside a podman checkpoint archive, and deleted.files: what podman writes into (and
removes from) a restored container's root before any runtime runs.

podman puts the container's changed files in `rootfs-diff.tar`, its deletions in `deleted.files`
(a JSON list of paths), its named volumes in `volumes/NAME.tar` and its /dev/shm in
`devshm-checkpoint.tar`. podman 4.3 unpacks them as root on the host, not confined to the
container's root: a link the tar makes, or one the container's image has (Debian's
`/var/run -> /run`), is followed out of it, and `/../..` in deleted.files removes host files.

`EntryRules` is the one list of what an entry of such a tar may be, kept by the import's check
(`NestedTarCheck`, as the archive streams past) and by the shim when it applies a staged
rootfs-diff.tar itself (host/rooted.py): the same parse, the same answer.
"""

from __future__ import annotations

import json
import posixpath
import re
import tarfile
from dataclasses import dataclass, field
from typing import Final

from ..errors import ImageError
from . import tarstream
from .tarstream import Data

ROOTFS_DIFF: Final = "rootfs-diff.tar"
DELETED_FILES: Final = "deleted.files"
DEVSHM = "devshm-checkpoint.tar"
VOLUME_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"  # podman's volume names (libpod define.NameRegex), bounded
VOLUME_TAR = re.compile(rf"volumes/({VOLUME_NAME})\.tar")
MAX_DELETED_FILES_BYTES = 16 << 20
# A container that installed a framework changes ~100k files; each kept path costs ~100 bytes here.
MAX_NESTED_ENTRIES = 1_000_000
# Linux's PATH_MAX, and a depth no container's files reach (deep node_modules trees: ~40): each entry's
# ancestors are looked up, so the check's and the application's cost grows with the depth
MAX_PATH_BYTES = 4095
MAX_DEPTH = 128
MAX_ID = 2**32 - 2  # uid/gid: (uid_t)-1 means "leave as is" to chown
# podman writes these tars uncompressed; its unpacker (containers/storage archive.Untar) would
# decompress any of these, so a 41 KB entry could become GiBs on the node's disk.
COMPRESSION_MAGIC = {b"\x28\xb5\x2f\xfd": "zstd", b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"BZh": "bzip2",
                     b"\x04\x22\x4d\x18": "lz4"}
# xattrs podman would set on a restored file: user data, SELinux labels and ACLs; not trusted.*
# (the host's), and security.capability only where the operator allows file capabilities.
XATTR_PREFIXES = ("SCHILY.xattr.", "LIBARCHIVE.xattr.")
ALLOWED_XATTRS = ("user.", "security.selinux", "system.posix_acl_access", "system.posix_acl_default")
CAPABILITY_XATTR = "security.capability"
ALLOW_KEY = "import.allow_setuid_files"


def is_nested_tar(name: str) -> bool:
    return name in (ROOTFS_DIFF, DEVSHM) or name.startswith("volumes/")


def volume_of(name: str) -> str | None:
    """The volume a `volumes/NAME.tar` entry fills, if its name is one podman could have written."""
    match = VOLUME_TAR.fullmatch(name)
    return match.group(1) if match else None


def _kind(member: tarfile.TarInfo) -> str:
    kinds = {tarfile.CHRTYPE: "c", tarfile.BLKTYPE: "b"}
    if member.type in kinds:
        return f"a device node ({kinds[member.type]} {member.devmajor}:{member.devminor})"
    return f"an entry of tar type {member.type!r}"


@dataclass
class EntryRules:
    """What one nested tar's entries may be, in order: names inside the root, no device nodes,
    no entry written through a link the tar made earlier, hard links only to files the tar made,
    no setuid, setgid or file capabilities unless `allow_setuid`."""

    where: str
    allow_setuid: bool = False
    links: dict[str, str] = field(default_factory=dict)  # symlinks the tar made so far: path -> target
    files: set[str] = field(default_factory=set)  # regular files it made so far
    directories: set[str] = field(default_factory=set)  # directories it made so far
    count: int = 0

    def _refused(self, name: str, what: str) -> ImageError:
        return ImageError(f"{self.where}: entry {name[:200]!r} {what}: refused")

    def admit(self, member: tarfile.TarInfo) -> str:
        """The entry's path inside the root (normalized, '.' for the root itself), if it may be applied."""
        self.count += 1
        if self.count > MAX_NESTED_ENTRIES:
            raise ImageError(f"{self.where}: more than {MAX_NESTED_ENTRIES} entries: refused")
        name = member.name
        path = self._inside(name)
        if not (0 <= member.uid <= MAX_ID and 0 <= member.gid <= MAX_ID):
            raise self._refused(name, f"is owned by uid {member.uid} gid {member.gid} (allowed: 0-{MAX_ID})")
        if path == "." and not member.isdir():
            raise self._refused(name, "names the root itself and is not a directory")
        if posixpath.basename(path).startswith(".wh."):
            raise self._refused(name, "is a whiteout (podman writes deletions into deleted.files)")
        self._ancestors(name, path)
        self._type(member, path)
        self._xattrs(member)
        if path in self.directories and not member.isdir():
            # what the tar put below it would be gone, and a hard link or a write could still name it
            raise self._refused(name, "replaces a directory the tar made earlier")
        self.links.pop(path, None)  # a later entry replaces what was at its path (podman removes it first)
        self.files.discard(path)
        if member.issym():
            self.links[path] = member.linkname
        elif member.isreg() or member.islnk():
            self.files.add(path)
        elif member.isdir():
            self.directories.add(path)
        # its parents are directories from now on, named by the tar or made for it: none may become a link
        parent = posixpath.dirname(path)
        while parent and parent not in self.directories:
            self.directories.add(parent)
            parent = posixpath.dirname(parent)
        return path

    def _type(self, member: tarfile.TarInfo, path: str) -> None:
        if member.issym():
            self._symlink(member, path)
        elif member.islnk():
            self._hardlink(member)
        elif member.isreg():
            if member.mode & 0o6000 and not self.allow_setuid:
                raise self._refused(member.name, f"is a setuid or setgid file (mode {member.mode & 0o7777:o}); the "
                                                 f"operator may allow them with {ALLOW_KEY} = true")
        elif not (member.isdir() or member.isfifo()):
            raise self._refused(member.name, f"is {_kind(member)}")

    def _inside(self, name: str) -> str:
        if "\0" in name or not name:
            raise self._refused(name, "has an empty name or a NUL byte")
        if name.startswith("/"):
            raise self._refused(name, "has an absolute name")
        path = posixpath.normpath(name)
        if path == ".." or path.startswith("../") or "/../" in f"/{name}/":
            raise self._refused(name, "has '..' in its name")
        if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES or path.count("/") >= MAX_DEPTH:
            raise self._refused(name, f"is longer than {MAX_PATH_BYTES} bytes or deeper than {MAX_DEPTH} directories")
        return path

    def _ancestors(self, name: str, path: str) -> None:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in self.links:
                raise self._refused(name, f"is written through the link {parent!r} (to {self.links[parent][:80]!r}) "
                                          "the tar makes earlier")

    def _symlink(self, member: tarfile.TarInfo, path: str) -> None:
        target = member.linkname
        if "\0" in target or not target:
            raise self._refused(member.name, "is a link with an empty target or a NUL byte")
        if len(target.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
            raise self._refused(member.name, f"is a link to a target longer than {MAX_PATH_BYTES} bytes")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if not target.startswith("/") and (resolved == ".." or resolved.startswith("../")):
            raise self._refused(member.name, f"is a link leaving the container's root ({target[:80]!r})")

    def _hardlink(self, member: tarfile.TarInfo) -> None:
        target = self._inside(member.linkname)
        if target not in self.files:
            raise self._refused(member.name, f"is a hard link to {member.linkname[:80]!r}, which is not a file "
                                             "made earlier in the tar")

    def _xattrs(self, member: tarfile.TarInfo) -> None:
        for key in member.pax_headers:
            prefix = next((p for p in XATTR_PREFIXES if key.startswith(p)), None)
            if prefix is None:
                continue
            xattr = key.removeprefix(prefix)
            if xattr == CAPABILITY_XATTR:
                if not self.allow_setuid:
                    raise self._refused(member.name, f"carries file capabilities ({xattr}); the operator may allow "
                                                     f"them with {ALLOW_KEY} = true")
            elif not xattr.startswith(ALLOWED_XATTRS):
                raise self._refused(member.name, f"carries the xattr {xattr[:80]!r} (allowed: "
                                                 f"{', '.join(ALLOWED_XATTRS)})")


class NestedTarCheck:
    """A nested tar's bytes, fed in order with write(), each entry checked by EntryRules as its
    header passes; finish() at the end of the outer entry. Data is passed over, not kept."""

    def __init__(self, where: str, allow_setuid: bool = False) -> None:
        self.rules = EntryRules(where, allow_setuid)
        self.where = where
        self.header = bytearray()  # the header blocks (extensions first) of the entry being read
        self.wanted = tarstream.BLOCK  # header bytes still to come before the next step
        self.skip = 0  # data bytes (with padding) of the current entry still to pass
        self.seen = 0
        self.zero_blocks = 0
        self.extension_data = False  # the bytes awaited are a PAX or GNU extension's data
        self.kinds: list[bytes] = []  # the extension headers before the entry being read
        self.ended = False
        self.trailing = 0

    def write(self, data: Data) -> None:
        view = memoryview(data).cast("B")
        if self.seen == 0 and len(view):
            self._not_compressed(bytes(view[:6]))
        self.seen += len(view)
        at = 0
        while at < len(view):
            if self.ended:
                self._trailing(view[at:])
                return
            if self.skip:
                step = min(self.skip, len(view) - at)
                self.skip -= step
                at += step
                continue
            step = min(self.wanted, len(view) - at)
            self.header += view[at:at + step]
            self.wanted -= step
            at += step
            if not self.wanted:
                self._header_done()

    def _trailing(self, rest: memoryview) -> None:
        """After the end blocks: zeros only (tar pads to its record), as tarstream reads them."""
        self.trailing += len(rest)
        if any(rest) or self.trailing > tarstream.MAX_TRAILING_ZEROS:
            raise ImageError(f"{self.where}: data after the end-of-archive blocks: refused")

    def _not_compressed(self, start: bytes) -> None:
        for magic, kind in COMPRESSION_MAGIC.items():
            if start.startswith(magic):
                raise ImageError(f"{self.where}: is compressed ({kind}); podman writes it as a plain tar and would "
                                 "unpack a compressed one whatever it expands to: refused")

    def _header_done(self) -> None:
        """A header block, or an extension's data, is complete."""
        if self.extension_data:
            self.extension_data, self.wanted = False, tarstream.BLOCK
            return
        block = bytes(self.header[-tarstream.BLOCK:])
        if block == bytes(tarstream.BLOCK):
            if len(self.header) > tarstream.BLOCK:
                raise ImageError(f"{self.where}: an extension header with no entry: refused")
            self.zero_blocks += 1
            self.header.clear()
            self.wanted = tarstream.BLOCK
            self.ended = self.zero_blocks == 2  # a reader stops here; what follows is never read
            return
        if self.zero_blocks:
            raise ImageError(f"{self.where}: an entry after an end-of-archive block: refused")
        raw = tarstream.raw_header(block, self.where)
        tarstream.refuse_old_header(block, self.where)
        if raw.type in tarstream.EXTENSION_TYPES:
            self.kinds.append(raw.type)
            tarstream.refuse_ambiguous_extensions(self.kinds, self.where)
            if len(self.header) + raw.size > tarstream.MAX_EXTENSION_BYTES:
                raise ImageError(f"{self.where}: extension headers of more than {tarstream.MAX_EXTENSION_BYTES} "
                                 "bytes before one entry: refused")
            self.wanted = tarstream.padded(raw.size) or tarstream.BLOCK
            self.extension_data = raw.size > 0
            return
        member = tarstream.parse_header(bytes(self.header), self.where)
        if member.type == tarfile.GNUTYPE_SPARSE or member.sparse is not None:
            raise ImageError(f"{self.where}: entry {member.name!r} is a sparse file: refused")
        self.rules.admit(member)
        self.kinds.clear()
        self.header.clear()
        self.wanted = tarstream.BLOCK
        self.skip = tarstream.padded(member.size) if member.isreg() else 0

    def finish(self) -> None:
        if self.skip or (self.header and not self.ended):
            raise ImageError(f"{self.where}: truncated: it ends inside an entry: refused")
        if not self.ended:  # tarstream, which the shim reads it with, wants both end-of-archive blocks
            raise ImageError(f"{self.where}: truncated: no end-of-archive blocks: refused")


def parse_deleted_files(data: bytes, where: str) -> list[str]:
    """deleted.files: podman's JSON list of the paths the container deleted, each normalized
    and inside the root (relative); an ImageError names the first that is not."""
    try:
        paths = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ImageError(f"{where}: not a JSON list of paths: {str(error)[:120]}") from None
    if not isinstance(paths, list) or not all(isinstance(path, str) for path in paths):
        raise ImageError(f"{where}: not a JSON list of paths")
    inside = []
    for path in paths:
        normalized = posixpath.normpath("/" + path).lstrip("/") if path else ""
        if not path or "\0" in path or ".." in path.split("/") or normalized in ("", "."):
            raise ImageError(f"{where}: the path {path[:200]!r} is not a file inside the container's root "
                             "(no '..', not the root itself): refused")
        inside.append(normalized)
    return inside
