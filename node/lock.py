"""The one gpuckpt operation on a container at a time: an flock on a file in the runtime state directory
(/run), which the kernel drops when its holder dies. Apart from the journal (node/journal.py, pydantic):
`delete` ends every container and takes only this.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re

from ..errors import GpuckptError, ImageError
from ..host.safefiles import private_directory
from .paths import state_dir

# runc's own rule for container IDs (libcontainer's idRegex); podman and docker IDs are hex.
_CONTAINER_ID = re.compile(r"^[\w+\-.]{1,1024}$")


class BusyError(GpuckptError):
    """Another gpuckpt process is working on the container; nothing was touched."""


def checked_container_id(container: str) -> str:
    """`container`, if it can name a file of ours (a journal, a lock)."""
    if not _CONTAINER_ID.match(container) or container.startswith("."):
        raise ImageError(f"container ID {container!r} cannot name a journal (allowed: letters, digits, _+-.)")
    return container


def _lock_name(container: str) -> str:
    return f"{checked_container_id(container)}.lock"


class ContainerLock:
    """The one gpuckpt operation on a container at a time: an flock the kernel drops if we die."""

    def __init__(self, container: str, verb: str) -> None:
        self.container, self.verb = container, verb
        self.fd = -1

    def __enter__(self) -> ContainerLock:
        name = _lock_name(self.container)
        dir_fd = private_directory(os.path.join(state_dir(), "locks"))
        try:
            while not self._lock(dir_fd, name):
                pass  # a delete removed the file we opened before we locked it: the name's file now
        finally:
            os.close(dir_fd)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()} {self.verb}\n".encode(), 0)
        return self

    def _lock(self, dir_fd: int, name: str) -> bool:
        self.fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_holder(self.fd)
            self.release()
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise BusyError(f"{self.verb} of {self.container} refused: another gpuckpt process{holder} is "
                            "working on it; nothing was touched (try again when it ends)") from None
        try:
            current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino
        except FileNotFoundError:
            current = -1
        if current == os.fstat(self.fd).st_ino:
            return True
        self.release()
        return False

    def remove_file(self) -> None:
        """Unlink the lock file while holding it (a deleted container's): whoever opened it before
        finds it gone once it has the lock, and takes the name's new one."""
        dir_fd = os.open(os.path.join(state_dir(), "locks"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.unlink(_lock_name(self.container), dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the lock goes with the descriptor
            self.fd = -1

    def __exit__(self, *_exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        pid, verb = os.pread(fd, 64, 0).decode().split()[:2]
        return f" (pid {int(pid)}, {verb[:16]})"
    except (ValueError, OSError):
        return ""
