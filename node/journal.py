"""The journal of a checkpoint or restore in progress (node/lock.py makes it one at a time).

Before each phase that changes something (CUDA processes locked, the delegate dumping or
restoring, the driver restoring), the shim writes what it is about to do and what it would
take to undo or finish it into a root-only journal, one file per container (its ID under its
runtime's root: node/lock.py's StateKey names it). It removes the
file when the verb ends, whichever way. A journal whose container's lock nobody holds was
left by a shim that was killed (SIGKILL, OOM, a crash): shim/recover.py finishes it.

Journals live on disk (/var/lib/gpuckpt/journal): after a reboot the processes they name are
gone, but an image the dump completed can still be marked complete. Each names the boot it
was written in, so no process of another boot is ever touched. Locks are flock()s on files
in the runtime state directory (/run): the kernel drops one when its holder dies.

A journal of the layout before roots counted (named by the ID alone, no `root` field) is one a
shim of an older gpuckpt left when it was killed, or one such a shim is writing during the
upgrade: it is still listed, locked under its old name, and finished by the next owned verb on
the container under the root its `global_argv` names (shim/recover.py).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ImageError
from ..host.procfs import start_time
from ..host.safefiles import private_directory, read_bounded, write_private_at
from .lock import BusyError, ContainerLock, StateKey

SCHEMA_VERSION = 1
DEFAULT_JOURNAL_DIR = "/var/lib/gpuckpt/journal"
JOURNAL_DIR_ENV = "GPUCKPT_JOURNAL_DIR"
MAX_JOURNAL_BYTES = 1 << 20
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

Phase = Literal[
    "prepared",       # checkpoint: manifest written (incomplete); nothing touched yet
    "gpu_checkpoint",  # checkpoint: CUDA processes being locked and checkpointed
    "dump",           # checkpoint: the delegate dumps (delegate_pid)
    "gpu_resume",     # checkpoint --leave-running: the dump completed; CUDA processes being restored, unlocked
    "move_staged",    # checkpoint --leave-running: the dump staged in memory being moved to the image directory
    "restore",        # restore: the delegate restores (delegate_pid)
    "gpu_restore",    # restore: the restored CUDA processes being restored and unlocked
]


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
    delegate: str = ""  # the delegate's path (the call's name may choose it: "" in a journal from before that)
    root: str = ""  # the runtime's root, absolute, as StateKey has it ("": a journal of the layout before roots)
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


def journal_dir() -> str:
    return os.environ.get(JOURNAL_DIR_ENV) or DEFAULT_JOURNAL_DIR


def _name(key: StateKey) -> str:
    return f"{key.name}.json"


def journal_key(journal: Journal) -> StateKey:
    return StateKey.of(journal.container, journal.root) if journal.root else StateKey.legacy(journal.container)


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
        name = _name(journal_key(journal))
        temporary = f".{name}.{os.getpid()}.tmp"
        write_private_at(fd, temporary, journal.model_dump_json(indent=2).encode())
        os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def read_journal(key: StateKey) -> Journal | None:
    path = os.path.join(journal_dir(), _name(key))
    if not os.path.lexists(path):
        return None
    what = f"{path}: journal"
    try:
        return Journal.model_validate(json.loads(read_bounded(path, MAX_JOURNAL_BYTES, what)))
    except (ValueError, ValidationError) as error:
        raise ImageError(f"{what} unreadable ({str(error).splitlines()[0]}): remove it once the container "
                         "is checked (its CUDA processes: gpuckpt status)") from None


def remove_journal(key: StateKey) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(journal_dir(), _name(key)))


def pending_journals() -> list[StateKey]:
    """The containers that have a journal (in progress, or left by a killed shim); names that are not a
    journal's are left out."""
    try:
        names = os.listdir(journal_dir())
    except FileNotFoundError:
        return []
    keys = []
    for name in sorted(names):
        if name.endswith(".json") and not name.startswith("."):
            with contextlib.suppress(ImageError):
                keys.append(StateKey.listed(name.removesuffix(".json")))
    return keys


def left_journals() -> list[StateKey]:
    """The containers whose journal no live gpuckpt holds: left by a killed shim, to be finished."""
    left = []
    for key in pending_journals():
        try:
            with ContainerLock(key, "check"):
                left.append(key)
        except BusyError:
            continue  # in progress
        except (ImageError, OSError):
            left.append(key)
    return left
