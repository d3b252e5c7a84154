"""Hard links made, and removed, in a container's own tree for files its processes hold under a removed name.

The container is not trusted, so everything goes through descriptors: the file is the one /proc hands
over for a process's fd or mapping (the kernel's object, never a path), the directory is resolved in
the container's root (a process's, openat2 RESOLVE_IN_ROOT, no symlink and no magic link followed), and the link is
made from the file's descriptor (linkat AT_EMPTY_PATH), only where the directory is on the file's own
filesystem. A name already there is never replaced.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import posixpath
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from . import procfs
from .libc import RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, link_descriptor, openat2

IN_ROOT_NO_LINKS = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
MAX_DIRECTORY_ENTRIES = 65_536  # entries of a directory looked at for names to remove


@dataclass(frozen=True)
class HeldFile:
    """A still-linked regular file some process holds under a removed name; `fd` is O_PATH."""

    pid: int  # a process holding it
    fd: int
    dev: int
    ino: int


@contextlib.contextmanager
def held_files(pids: Iterable[int], removed_name: str) -> Iterator[list[HeldFile]]:
    """The distinct files (by device and inode) `pids` hold open or mapped under `removed_name`
    that another name still links, one descriptor each, closed when the block ends."""
    found: dict[tuple[int, int], HeldFile] = {}
    opened: list[int] = []
    try:
        for pid in pids:
            for fd in procfs.open_deleted(pid, removed_name):
                opened.append(fd)
                status = os.fstat(fd)
                if status.st_nlink > 0:
                    found.setdefault((status.st_dev, status.st_ino), HeldFile(pid, fd, status.st_dev, status.st_ino))
        yield list(found.values())
    finally:
        for fd in opened:
            os.close(fd)


@contextlib.contextmanager
def directory_in_root(pid: int, path: str, listable: bool = False) -> Iterator[int]:
    """The directory `path` as process `pid` sees it, resolved in its root without following any link
    (ELOOP where the container put one); an O_PATH descriptor, or O_RDONLY with `listable`."""
    root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = openat2(root, path.lstrip("/") or ".", (os.O_RDONLY if listable else os.O_PATH) | os.O_DIRECTORY,
                     IN_ROOT_NO_LINKS)
    finally:
        os.close(root)
    try:
        yield fd
    finally:
        os.close(fd)


def link_in_root(held: HeldFile, root_pid: int, path: str) -> bool:
    """A hard link to `held` at `path` (absolute, in process `root_pid`'s root): True when made now, False when
    that name already links it. OSError where the directory is on another filesystem (EXDEV), or the
    name is something else (EEXIST): never replaced."""
    directory, name = posixpath.split(path)
    if not name or name in (".", ".."):
        raise OSError(errno.EINVAL, f"{path!r} names no file")
    with directory_in_root(root_pid, directory) as dir_fd:
        if os.fstat(dir_fd).st_dev != held.dev:
            raise OSError(errno.EXDEV, f"{directory} is not on the file's filesystem")
        try:
            link_descriptor(held.fd, dir_fd, name)
            made = True
        except FileExistsError:
            made = False
        there = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (there.st_dev, there.st_ino) != (held.dev, held.ino):
            raise OSError(errno.EEXIST, f"{path} is there already and is another file")
        return made


def remove_links_in_root(held: Iterable[HeldFile], root_pid: int, directory: str,
                         name_pattern: re.Pattern[str]) -> list[str]:
    """Remove the names in `directory` (in process `root_pid`'s root) that match `name_pattern` and link one of the
    `held` files (regular files, the same device and inode; nothing else is touched); the paths removed."""
    by_inode = {(file.dev, file.ino): file for file in held}
    if not by_inode:
        return []
    removed = []
    with directory_in_root(root_pid, directory, listable=True) as dir_fd:
        with os.scandir(dir_fd) as entries:
            names = [entry.name for entry in itertools.islice(entries, MAX_DIRECTORY_ENTRIES)
                     if name_pattern.fullmatch(entry.name)]
        for name in names:  # a name the container swaps meanwhile is its own, in its own directory
            try:
                there = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISREG(there.st_mode) and (there.st_dev, there.st_ino) in by_inode:
                    os.unlink(name, dir_fd=dir_fd)
                    removed.append(posixpath.join(directory, name))
            except FileNotFoundError:
                continue  # gone meanwhile
    return removed
