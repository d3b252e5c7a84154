"""The one gpuckpt operation on a container at a time: an flock on a file in the runtime state directory
(/run), which the kernel drops when its holder dies. Apart from the journal (node/journal.py, pydantic):
`delete` ends every container and takes only this.

A container is its ID under its runtime's root, as runc's state directory is (`--root A` and `--root B`
may each have a container "web"): locks and journals are named `ID@DIGEST` (StateKey), DIGEST naming
the root. Names of the layout before roots (`ID`) are still read (StateKey.legacy: node/journal.py).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from typing import NamedTuple

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


ROOT_DIGEST_CHARS = 16  # of the root's sha256: a name per root, with no chance of two roots sharing one
SHOWN_ID_CHARS = 160  # a longer ID is shown cut, and its digest added: a name stays within NAME_MAX (255)


def _digest(text: str, chars: int) -> str:
    import hashlib  # deferred: OpenSSL's load costs 5-15 ms, and `delete` (every container's end) loads this module

    return hashlib.sha256(text.encode(errors="surrogateescape")).hexdigest()[:chars]


class StateKey(NamedTuple):
    """Which container a lock or journal is for: its ID, its runtime's root, and their file name."""

    container: str
    root: str  # absolute; "" for a name of the layout before roots (keyed on the ID alone)
    name: str  # ID@DIGEST: the lock's and journal's name, less their suffix

    @classmethod
    def of(cls, container: str, root: str) -> StateKey:
        """The container `container` of the runtime whose root (state directory) is `root`, absolute."""
        checked_container_id(container)
        if not root.startswith("/"):
            raise ImageError(f"runtime root {root!r} is not absolute (a bug: resolve it first)")
        root = os.path.normpath(root)  # "/r/" and "/r" are one root
        shown = container if len(container) <= SHOWN_ID_CHARS else \
            f"{container[:SHOWN_ID_CHARS]}~{_digest(container, ROOT_DIGEST_CHARS)}"
        return cls(container, root, f"{shown}@{_digest(root, ROOT_DIGEST_CHARS)}")

    @classmethod
    def legacy(cls, container: str) -> StateKey:
        """The name gpuckpt gave the container's lock and journal before roots counted: its ID alone."""
        return cls(container, "", checked_container_id(container))

    @classmethod
    def listed(cls, name: str) -> StateKey:
        """A name found in the journal directory, its root not known until its journal is read."""
        container = name.split("@", 1)[0].split("~", 1)[0]
        if "@" not in name:
            return cls.legacy(name)
        checked_container_id(container)
        if not re.fullmatch(r"[\w+\-.~]{1,200}@[0-9a-f]{%d}" % ROOT_DIGEST_CHARS, name, re.ASCII):
            raise ImageError(f"{name!r} is not a gpuckpt journal name (ID@DIGEST)")
        return cls(container, "", name)


def _lock_name(key: StateKey) -> str:
    return f"{key.name}.lock"


def has_lock_file(key: StateKey) -> bool:
    """Whether the container has a lock file (one was taken since it was created, and not removed)."""
    return os.path.exists(os.path.join(state_dir(), "locks", _lock_name(key)))


def id_has_lock_files(container: str) -> bool:
    """Whether any lock file of this ID exists, under any root (the compiled launcher's test, in C)."""
    try:
        names = os.listdir(os.path.join(state_dir(), "locks"))
    except OSError:
        return False
    return any(name == f"{container}.lock" or name.startswith((f"{container}@", f"{container}~")) for name in names)


class ContainerLock:
    """The one gpuckpt operation on a container at a time: an flock the kernel drops if we die."""

    def __init__(self, key: StateKey, verb: str) -> None:
        self.key, self.container, self.verb = key, key.container, verb
        self.fd = -1

    def __enter__(self) -> ContainerLock:
        name = _lock_name(self.key)
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
            os.unlink(_lock_name(self.key), dir_fd=dir_fd)
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
