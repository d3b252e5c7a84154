"""The journal of a checkpoint or restore in progress, and the lock that makes it one at a time.

Before each phase that changes something (CUDA processes locked, the delegate dumping or
restoring, the driver restoring), the shim writes what it is about to do and what it would
take to undo or finish it into a root-only journal, one file per container. It removes the
file when the verb ends, whichever way. A journal whose container's lock nobody holds was
left by a shim that was killed (SIGKILL, OOM, a crash): shim/recover.py finishes it.

Journals live on disk (/var/lib/gpuckpt/journal): after a reboot the processes they name are
gone, but an image the dump completed can still be marked complete. Each names the boot it
was written in, so no process of another boot is ever touched. Locks are flock()s on files
in the runtime state directory (/run): the kernel drops one when its holder dies.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuckpt.errors import GpuckptError, ImageError
from gpuckpt.host.procfs import start_time
from gpuckpt.host.safefiles import private_directory, read_bounded, write_private_at
from gpuckpt.node.paths import state_dir

SCHEMA_VERSION = 1
DEFAULT_JOURNAL_DIR = "/var/lib/gpuckpt/journal"
JOURNAL_DIR_ENV = "GPUCKPT_JOURNAL_DIR"
MAX_JOURNAL_BYTES = 1 << 20
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# runc's own rule for container IDs (libcontainer's idRegex); podman and docker IDs are hex.
_CONTAINER_ID = re.compile(r"^[\w+\-.]{1,1024}$")

Phase = Literal[
    "prepared",       # checkpoint: manifest written (incomplete); nothing touched yet
    "gpu_checkpoint",  # checkpoint: CUDA processes being locked and checkpointed
    "dump",           # checkpoint: the delegate dumps (delegate_pid)
    "gpu_resume",     # checkpoint --leave-running: the dump completed; CUDA processes being restored, unlocked
    "move_staged",    # checkpoint --leave-running: the dump staged in memory being moved to the image directory
    "restore",        # restore: the delegate restores (delegate_pid)
    "gpu_restore",    # restore: the restored CUDA processes being restored and unlocked
]


class BusyError(GpuckptError):
    """Another gpuckpt process is working on the container; nothing was touched."""


class JournalProcess(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host_pid: int
    start_time: int  # with host_pid: this process, not one that took its PID later
    container_pid: int


class Journal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    container: str
    verb: Literal["checkpoint", "restore"]
    phase: Phase
    boot_id: str
    shim_pid: int
    global_argv: list[str] = []  # the delegate's global options (--root ...), as the engine gave them
    image_dir: str
    work_dir: str = ""  # where CRIU's log is (the image directory unless --work-path)
    leave_running: bool = False
    gpu: bool = False  # a GPU checkpoint (the driver's steps are the shim's)
    refreeze: bool = False  # the engine had frozen the container: frozen again when it is put back
    processes: list[JournalProcess] = []
    delegate_pid: int = 0
    delegate_start_time: int = 0
    staging_dir: str = ""  # --leave-running: where the dump went first (shim/staging.py)
    dump_began: float = 0.0  # time.time() as the dump phase began: a CRIU log older than it is another dump's
    gpu_pairs: list[tuple[str, str]] = []  # restore: GPU UUIDs, checkpointed -> this node's


def _lock_name(container: str) -> str:
    return _name(container).removesuffix(".json") + ".lock"


def journal_dir() -> str:
    return os.environ.get(JOURNAL_DIR_ENV) or DEFAULT_JOURNAL_DIR


def _name(container: str) -> str:
    if not _CONTAINER_ID.match(container) or container.startswith("."):
        raise ImageError(f"container ID {container!r} cannot name a journal (allowed: letters, digits, _+-.)")
    return f"{container}.json"


def boot_id() -> str:
    with open(BOOT_ID_PATH) as source:
        return source.read().strip()


def process_record(host_pid: int, container_pid: int) -> JournalProcess | None:
    started = start_time(host_pid)
    return None if started is None else JournalProcess(host_pid=host_pid, start_time=started,
                                                       container_pid=container_pid)


def same_process(host_pid: int, started: int) -> bool:
    """Whether `host_pid` is still the process that started at `started` (not a reuse of its PID)."""
    return host_pid > 0 and start_time(host_pid) == started


def write_journal(journal: Journal) -> None:
    """Replace the container's journal at once (written beside it, then renamed)."""
    fd = private_directory(journal_dir())
    try:
        name = _name(journal.container)
        temporary = f".{name}.{os.getpid()}.tmp"
        write_private_at(fd, temporary, journal.model_dump_json(indent=2).encode())
        os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def read_journal(container: str) -> Journal | None:
    path = os.path.join(journal_dir(), _name(container))
    if not os.path.lexists(path):
        return None
    what = f"{path}: journal"
    try:
        return Journal.model_validate(json.loads(read_bounded(path, MAX_JOURNAL_BYTES, what)))
    except (ValueError, ValidationError) as error:
        raise ImageError(f"{what} unreadable ({str(error).splitlines()[0]}): remove it once the container "
                         "is checked (its CUDA processes: gpuckpt status)") from None


def remove_journal(container: str) -> None:
    try:
        os.unlink(os.path.join(journal_dir(), _name(container)))
    except FileNotFoundError:
        pass


def pending_journals() -> list[str]:
    """The containers that have a journal (in progress, or left by a killed shim)."""
    try:
        names = os.listdir(journal_dir())
    except FileNotFoundError:
        return []
    return sorted(name.removesuffix(".json") for name in names
                  if name.endswith(".json") and not name.startswith("."))


def left_journals() -> list[str]:
    """The containers whose journal no live gpuckpt holds: left by a killed shim, to be finished."""
    left = []
    for container in pending_journals():
        try:
            with ContainerLock(container, "check"):
                left.append(container)
        except BusyError:
            continue  # in progress
        except (ImageError, OSError):
            left.append(container)
    return left


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
