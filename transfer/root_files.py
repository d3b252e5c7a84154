"""A staged import's root filesystem diff and deletions, /dev/shm and named volumes, applied by
the shim, each inside its own directory (host/rooted.py: the container's root, the tmpfs podman
mounted for /dev/shm, each volume's directory) before CRIU restores its processes; podman never
sees them. A leave-running dump's own copy of /dev/shm (transfer/devshm.py), signed with its images, is
applied in place of podman's, which is of a later moment (also where podman's own restore unpacked its copy).

The diff is read with the same parse and the same rules as the import checked it with
(oci.nested_tar.EntryRules): whatever the check passed is what is applied, and what it would
refuse is refused here too.
"""

from __future__ import annotations

import os
import tarfile

from ..errors import ImageError
from ..host.rooted import Owner, RootedTree
from ..host.safefiles import read_bounded
from ..oci import tarstream
from ..oci.bundle_layout import in_containers_storage
from ..oci.nested_tar import (
    ALLOWED_XATTRS,
    CAPABILITY_XATTR,
    DELETED_FILES,
    DEVSHM,
    MAX_DELETED_FILES_BYTES,
    MAX_NESTED_ENTRIES,
    ROOTFS_DIFF,
    XATTR_PREFIXES,
    EntryRules,
    parse_deleted_files,
    volume_of,
)
from ..oci.spec import Spec
from ..oci.tarstream import Data
from .devshm import DUMP_DEVSHM, dump_devshm
from .staging import ClaimedImport

SHM = "/dev/shm"


def apply_staged(spec: Spec, bundle: str, staged: ClaimedImport, what: str, image_dir: str = "") -> str:
    """Every root file a staged import left, each where podman would have unpacked it (/dev/shm from the dump's
    copy in `image_dir` where it has one); what was done."""
    files, done = dict(staged.root_files), []
    if DEVSHM in files and image_dir and (at_dump := dump_devshm(image_dir)):
        files[DEVSHM] = at_dump
        done.append("/dev/shm as copied at the dump, not the archive's later copy")
    if ROOTFS_DIFF in files or DELETED_FILES in files:
        root = spec.rootfs(bundle)
        if not root:
            raise ImageError(f"{what}: its bundle names no root filesystem for the imported files")
        applied, removed = apply_root_files(root, files.get(ROOTFS_DIFF), files.get(DELETED_FILES),
                                            allow_setuid=staged.allow_setuid_files, what=what)
        done.append(f"{applied} changed file(s) and {removed} deletion(s) inside its root")
    for entry, path in sorted(files.items()):
        volume = volume_of(entry)
        if entry != DEVSHM and volume is None:
            continue
        destination = SHM if volume is None else staged.volume_destinations.get(volume)
        if destination is None:
            raise ImageError(f"{what}: {entry} names no volume of the container: refused")
        directory = spec.bind_source(destination)
        if directory is None:
            raise ImageError(f"{what}: {entry}: the container has no mount at {destination} to restore it into")
        if volume is None and not _podmans_shm(directory, staged.storage):
            raise ImageError(f"{what}: {entry}: the container's /dev/shm comes from {directory}, not a directory "
                             f"podman makes under {staged.storage or '(no storage recorded)'}: refused")
        if volume is not None and directory != staged.volume_directories.get(volume):
            # the bind comes from spec.dump: only the volume's own directory takes its content
            raise ImageError(f"{what}: {entry}: the container mounts {directory} at {destination}, not the "
                             f"volume's directory {staged.volume_directories.get(volume)}: refused")
        with RootedTree(directory) as tree:
            count = _apply_diff(tree, path, staged.allow_setuid_files, f"{what}: {entry}")
        done.append(f"{count} entries of {entry} in {destination}")
    return "; ".join(done)


def replace_devshm(spec: Spec, bundle: str, image_dir: str, what: str) -> str:
    """podman's own restore (in place, or its --import) unpacked its later /dev/shm copy into the container's:
    replaced by the dump's copy in `image_dir` where there is one, only in podman's own /dev/shm directory of
    this bundle (GRAPHROOT/overlay-containers/ID/userdata/shm); what was done, or ""."""
    copy = dump_devshm(image_dir)
    directory = spec.bind_source(SHM)
    if not copy or directory is None or directory != os.path.join(bundle, "shm") or not in_containers_storage(bundle):
        return ""
    try:
        with RootedTree(directory) as tree:
            listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=tree.root_fd)  # the tree's own
            try:
                names = os.listdir(listing)
            finally:
                os.close(listing)
            for name in names:
                tree.remove(name)
            count = _apply_diff(tree, copy, False, f"{what}: {DUMP_DEVSHM}")
    except OSError as error:
        raise ImageError(f"{what}: /dev/shm as copied at the dump cannot replace the engine's copy in {directory}: "
                         f"{error.strerror or error}") from None
    return f"/dev/shm as copied at the dump ({count} entries) in place of the engine's later copy"


def _podmans_shm(directory: str, storage: str) -> bool:
    """Whether `directory` is where podman (root's, its storage at `storage`) keeps a container's /dev/shm."""
    parts = directory.split("/")
    return (bool(storage) and directory.startswith(f"{storage}/overlay-containers/") and ".." not in parts
            and len(parts) == len(storage.split("/")) + 4 and parts[-2:] == ["userdata", "shm"])


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
            for path in paths:
                try:
                    removed += tree.remove(path)
                except (OSError, RecursionError) as error:
                    reason = getattr(error, "strerror", None) or type(error).__name__
                    raise ImageError(f"{what}: deleted.files: {path[:200]!r} cannot be removed: {reason}") from None
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
        for member, reader in tarstream.entries(source, where, links=True, max_entries=MAX_NESTED_ENTRIES):
            rules.admit(member)
            if member.isreg():
                tarstream.copy_data(reader, member.size, None)
    rules = EntryRules(where, allow_setuid)
    count = 0
    with open(path, "rb") as source:
        for member, reader in tarstream.entries(source, where, links=True, max_entries=MAX_NESTED_ENTRIES):
            inside = rules.admit(member)  # refused here as the import's check refused it
            count += 1
            try:
                _apply_entry(tree, member, reader, inside)
            except (OSError, OverflowError, RecursionError) as error:
                reason = getattr(error, "strerror", None) or type(error).__name__
                raise ImageError(f"{where}: entry {member.name[:200]!r} cannot be made: {reason}") from None
    return count


def _apply_entry(tree: RootedTree, member: tarfile.TarInfo, reader: tarstream.EntryReader, inside: str) -> None:
    """One checked entry made in the tree (a file's data read from `reader`)."""
    owner = _owner(member)
    if inside == ".":
        return  # the root itself: the engine's mount point, kept as it is
    if member.isreg():
        fd = tree.file(inside, owner)
        try:
            tarstream.copy_data(reader, member.size, _FileSink(fd), pad=False)
        finally:
            tree.finish_file(fd, owner)
    elif member.isdir():
        tree.directory(inside, owner)
    elif member.issym():
        tree.symlink(inside, member.linkname, owner)
    elif member.islnk():
        tree.hardlink(inside, os.path.normpath(member.linkname))
    elif member.isfifo():
        tree.fifo(inside, owner)
