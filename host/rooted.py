"""Files made and removed inside a container's root as the container would see them.

Every path is resolved in that root (openat2 RESOLVE_IN_ROOT: `..` and absolute links stop at
it, no magic links, no other mount), so no link leads out of it: not one a tar made, nor one
of the container's image (Debian's `/var/run -> /run`, which podman 4.3's own unpacking follows
onto the host's /run). The last component of a path is never followed: what is there is
replaced, as podman's unpacking replaces it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ImageError
from .libc import RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_XDEV, openat2

IN_ROOT = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
NEW_DIRECTORY_MODE = 0o755  # a parent no entry names (podman: 0777 less the umask)


@dataclass(frozen=True)
class Owner:
    """What a made file gets: owner, permission bits, times in ns (None: now), xattrs."""

    uid: int
    gid: int
    mode: int
    mtime_ns: int | None = None
    xattrs: tuple[tuple[str, bytes], ...] = ()


class RootedTree:
    """A container's root on the host, opened once (O_PATH); every change is made from it."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    def __enter__(self) -> RootedTree:
        return self

    def __exit__(self, *failure: object) -> None:
        self.close()

    def _open_in_root(self, path: str) -> int:
        return openat2(self.root_fd, path or ".", os.O_PATH | os.O_DIRECTORY, IN_ROOT)

    @contextlib.contextmanager
    def parent(self, path: str, make: bool = True) -> Iterator[int | None]:
        """The directory `path` is in, resolved in the root (made, each missing part 0755, with
        `make`; else None when missing), and the last component's name is the caller's."""
        parent = posixpath.dirname(path)
        try:
            fd: int | None = self._open_in_root(parent)
        except FileNotFoundError:
            if not make:
                fd = None
            else:
                self._make_directories(parent)
                fd = self._open_in_root(parent)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def _make_directories(self, path: str) -> None:
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            with contextlib.suppress(FileNotFoundError):
                os.close(self._open_in_root("/".join(parts[:depth])))
                continue
            above = self._open_in_root("/".join(parts[:depth - 1]))
            try:
                os.mkdir(parts[depth - 1], NEW_DIRECTORY_MODE, dir_fd=above)
            except FileExistsError:  # a link there that leads nowhere inside the root
                raise ImageError(f"{self.root}: {'/'.join(parts[:depth])} is a link to nothing inside it: cannot "
                                 "make what the archive puts below it") from None
            finally:
                os.close(above)

    @staticmethod
    def _clear(parent_fd: int, name: str, keep_directory: bool) -> bool:
        """Remove what is at `name` (a whole directory, never following a link) unless it is a
        directory and `keep_directory`; whether a directory is kept."""
        try:
            found = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(found.st_mode):
            if keep_directory:
                return True
            try:
                shutil.rmtree(name, dir_fd=parent_fd)  # fd-based: links inside are removed, not followed
            except RecursionError:  # rmtree recurses per level: a chain an archive nested ~1000 deep (attack30m F2)
                raise OSError(errno.ELOOP, "it nests directories too deep to replace") from None
        else:
            os.unlink(name, dir_fd=parent_fd)
        return False

    def remove(self, path: str) -> bool:
        """Remove `path` (a directory with what it holds), as podman's os.RemoveAll; whether anything was there."""
        with self.parent(path, make=False) as parent_fd:
            if parent_fd is None:
                return False
            name = posixpath.basename(path)
            try:
                os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            self._clear(parent_fd, name, keep_directory=False)
            return True

    def directory(self, path: str, owner: Owner) -> None:
        with self.parent(path) as parent_fd:
            assert parent_fd is not None
            name = posixpath.basename(path)
            if not self._clear(parent_fd, name, keep_directory=True):
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
            try:
                _own(fd, owner)
            finally:
                os.close(fd)

    def file(self, path: str, owner: Owner) -> int:
        """A new regular file at `path` (what was there removed), open for writing; finish_file() owns it."""
        with self.parent(path) as parent_fd:
            assert parent_fd is not None
            name = posixpath.basename(path)
            self._clear(parent_fd, name, keep_directory=False)
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                           dir_fd=parent_fd)

    @staticmethod
    def finish_file(fd: int, owner: Owner) -> None:
        try:
            _own(fd, owner)
        finally:
            os.close(fd)

    def symlink(self, path: str, target: str, owner: Owner) -> None:
        with self.parent(path) as parent_fd:
            assert parent_fd is not None
            name = posixpath.basename(path)
            self._clear(parent_fd, name, keep_directory=False)
            os.symlink(target, name, dir_fd=parent_fd)
            os.chown(name, owner.uid, owner.gid, dir_fd=parent_fd, follow_symlinks=False)
            if owner.mtime_ns is not None:
                os.utime(name, ns=(owner.mtime_ns, owner.mtime_ns), dir_fd=parent_fd, follow_symlinks=False)

    def hardlink(self, path: str, target: str) -> None:
        """A hard link at `path` to the file `target`, both in the root (the target's last part not followed)."""
        with self.parent(target, make=False) as source_fd, self.parent(path) as parent_fd:
            if source_fd is None:
                raise FileNotFoundError(f"{target}: not in the container's root")
            assert parent_fd is not None
            name = posixpath.basename(path)
            self._clear(parent_fd, name, keep_directory=False)
            os.link(posixpath.basename(target), name, src_dir_fd=source_fd, dst_dir_fd=parent_fd,
                    follow_symlinks=False)

    def fifo(self, path: str, owner: Owner) -> None:
        with self.parent(path) as parent_fd:
            assert parent_fd is not None
            name = posixpath.basename(path)
            self._clear(parent_fd, name, keep_directory=False)
            os.mkfifo(name, 0o600, dir_fd=parent_fd)
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
            try:  # an O_PATH descriptor: chown and chmod through its /proc link, which names this very node
                os.chown(f"/proc/self/fd/{fd}", owner.uid, owner.gid)
                os.chmod(f"/proc/self/fd/{fd}", owner.mode & 0o777)
            finally:
                os.close(fd)


def _own(fd: int, owner: Owner) -> None:
    """Owner, then mode (chown clears setuid bits), xattrs and times, through the file's own descriptor."""
    os.fchown(fd, owner.uid, owner.gid)
    os.fchmod(fd, owner.mode & 0o7777)
    for name, value in owner.xattrs:
        os.setxattr(fd, name, value)
    if owner.mtime_ns is not None:
        os.utime(fd, ns=(owner.mtime_ns, owner.mtime_ns))
