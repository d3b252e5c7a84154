"""A staged import's root filesystem diff and deletions, applied by the shim inside the
container's root (host/rooted.py) before CRIU restores its processes; podman never sees them.

The diff is read with the same parse and the same rules as the import checked it with
(oci.nested_tar.EntryRules): whatever the check passed is what is applied, and what it would
refuse is refused here too.
"""

from __future__ import annotations

import os
import tarfile

from ..host.rooted import Owner, RootedTree
from ..host.safefiles import read_bounded
from ..oci import tarstream
from ..oci.nested_tar import (
    ALLOWED_XATTRS,
    CAPABILITY_XATTR,
    MAX_DELETED_FILES_BYTES,
    XATTR_PREFIXES,
    EntryRules,
    parse_deleted_files,
)
from ..oci.tarstream import Data


def apply_root_files(root: str, rootfs_diff: str | None, deleted_files: str | None, *, allow_setuid: bool,
                     what: str) -> tuple[int, int]:
    """podman's order: the diff, then the deletions; (entries applied, paths removed)."""
    applied = removed = 0
    with RootedTree(root) as tree:
        if rootfs_diff is not None:
            applied = _apply_diff(tree, rootfs_diff, allow_setuid, f"{what}: rootfs-diff.tar")
        if deleted_files is not None:
            paths = parse_deleted_files(read_bounded(deleted_files, MAX_DELETED_FILES_BYTES, deleted_files),
                                        f"{what}: deleted.files")
            removed = sum(tree.remove(path) for path in paths)
    return applied, removed


def _owner(member: tarfile.TarInfo) -> Owner:
    xattrs = []
    for key, value in member.pax_headers.items():
        prefix = next((p for p in XATTR_PREFIXES if key.startswith(p)), None)
        if prefix is not None and (name := key.removeprefix(prefix)).startswith((*ALLOWED_XATTRS, CAPABILITY_XATTR)):
            xattrs.append((name, value.encode("utf-8", "surrogateescape")))
    mtime = int(member.mtime) * 1_000_000_000 if 0 <= member.mtime < 2**33 else None
    return Owner(member.uid, member.gid, member.mode, mtime, tuple(xattrs))


class _FileSink:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: Data) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]


def _apply_diff(tree: RootedTree, path: str, allow_setuid: bool, where: str) -> int:
    with open(path, "rb") as source:  # the whole diff checked before anything is made
        rules = EntryRules(where, allow_setuid)
        for member, reader in tarstream.entries(source, where, links=True):
            rules.admit(member)
            if member.isreg():
                tarstream.copy_data(reader, member.size, None)
    rules = EntryRules(where, allow_setuid)
    count = 0
    with open(path, "rb") as source:
        for member, reader in tarstream.entries(source, where, links=True):
            inside = rules.admit(member)  # refused here as the import's check refused it
            count += 1
            owner = _owner(member)
            if inside == ".":
                pass  # the root itself: podman's mount point, kept as it is
            elif member.isreg():
                fd = tree.file(inside, owner)
                try:
                    tarstream.copy_data(reader, member.size, _FileSink(fd), pad=False)
                finally:
                    tree.finish_file(fd, owner)
                continue
            elif member.isdir():
                tree.directory(inside, owner)
            elif member.issym():
                tree.symlink(inside, member.linkname, owner)
            elif member.islnk():
                tree.hardlink(inside, os.path.normpath(member.linkname))
            elif member.isfifo():
                tree.fifo(inside, owner)
    return count
