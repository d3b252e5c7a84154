"""A --leave-running GPU dump into memory first: the workload waits for RAM's speed, not the disk's.

With --leave-running the CUDA processes stay locked from the device checkpoint until the
delegate's dump ends, so every second the dump spends writing the image to disk is GPU
downtime. When the container's memory fits in /dev/shm with room to spare, the delegate
dumps there (a private directory), the processes are restored and unlocked, and only then
are the images moved to the directory the engine named (a rename on one filesystem, a copy
through the kernel otherwise), before the manifest is completed and signed. CRIU's log stays
in the engine's work directory. When it does not fit, the dump goes to the engine's
directory as before, and the log says why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence

from ..host.procfs import resident_bytes

STAGING_ROOT = "/dev/shm"
# What the machine keeps free beside a staged dump: an eighth of its memory, at least 1 GiB.
RESERVE_FRACTION = 8
RESERVE_MIN_BYTES = 1 << 30
IMAGE_PATH_FLAGS = ("--image-path", "-image-path")
WORK_PATH_FLAGS = ("--work-path", "-work-path")


def _mem_available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def staging_refusal(pids: Sequence[int], root: str = STAGING_ROOT) -> str | None:
    """Why the container's dump cannot be staged in memory now (None: it can). Its size is what its
    processes hold resident, the device memory just moved to the host included."""
    return staging_refusal_for(resident_bytes(pids), root)


def staging_refusal_for(needed: int, root: str = STAGING_ROOT) -> str | None:
    """Why `needed` bytes cannot be staged in `root` now (None: they can)."""
    try:
        status = os.statvfs(root)
    except OSError as error:
        return f"{root}: {error.strerror}"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    reserve = max(total // RESERVE_FRACTION, RESERVE_MIN_BYTES)
    room = min(status.f_bavail * status.f_frsize, _mem_available()) - reserve
    if needed > room:
        return (f"its {needed >> 20} MiB would leave less than {reserve >> 20} MiB of memory free "
                f"({max(room, 0) >> 20} MiB to spare in {root})")
    return None


STAGING_PREFIX = "gpuckpt-stage-"


def make_staging_dir(root: str = STAGING_ROOT) -> str:
    """A new root-only directory for one dump (mkdtemp: 0700, a name nobody could have taken)."""
    return tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root)


def is_staging_dir(path: str, root: str = STAGING_ROOT) -> bool:
    """Whether `path` is one make_staging_dir made: in `root`, with its prefix, a real directory (no link), ours
    (this process's user) and private (0700): /dev/shm is anyone's, and a local user's look-alike of a staging
    directory a recovery looks for would have its files moved into an image directory (attack30f's lead)."""
    parent, name = os.path.split(os.path.normpath(path))
    if parent != root or not name.startswith(STAGING_PREFIX):
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o700


def replace_flag(argv: list[str], start: int, names: Sequence[str], value: str) -> bool:
    """Set every occurrence of the flag after `start` to `value`; whether there was one."""
    found = False
    index = start
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            break
        name, _, _ = arg.partition("=")
        if name in names and "=" in arg:
            argv[index], found = f"{name}={value}", True
        elif arg in names and index + 1 < len(argv):
            argv[index + 1], found = value, True
            index += 1
        index += 1
    return found


def staged_argv(argv: Sequence[str], verb_index: int, staging: str, image_dir: str, work_dir: str | None) -> list[str]:
    """The delegate's argv dumping into `staging`; CRIU's log where it would have been without staging
    (the engine's --work-path, else the image directory the engine named)."""
    staged = list(argv)
    at = verb_index + 1
    added: list[str] = []
    if not replace_flag(staged, at, IMAGE_PATH_FLAGS, staging):
        added += ["--image-path", staging]
    if not work_dir:
        os.makedirs(image_dir, mode=0o700, exist_ok=True)
        added += ["--work-path", image_dir]
    return [*staged[:at], *added, *staged[at:]]


def move_staged(staging: str, image_dir: str) -> int:
    """Move every file of the staged dump into `image_dir` (the engine's), then remove the staging
    directory; the bytes moved. A file of the same name there (an earlier dump's) is replaced. A move
    that fails (the disk full) drops the staged dump and its partial copy: memory is not left held."""
    temporary = ""
    try:
        os.makedirs(image_dir, mode=0o700, exist_ok=True)
        same_filesystem = os.stat(staging).st_dev == os.stat(image_dir).st_dev
        moved = 0
        with os.scandir(staging) as entries:
            names = [(entry.name, entry.stat(follow_symlinks=False)) for entry in entries]
        for name, status in names:
            source, target = os.path.join(staging, name), os.path.join(image_dir, name)
            if same_filesystem:
                os.replace(source, target)
            else:
                temporary = f"{target}.gpuckpt-{os.getpid()}.tmp"
                shutil.copy2(source, temporary, follow_symlinks=False)  # copy_file_range/sendfile: no buffer of ours
                os.replace(temporary, target)
                temporary = ""
                os.unlink(source)  # the memory goes back as each file lands
            moved += status.st_size
        os.rmdir(staging)
    except OSError:
        if temporary:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return moved
