"""What CRIU's own log says about a dump or a restore: whether a dump finished, and why either failed, in one line.

runc and crun leave CRIU's log (dump.log) in the work directory (the image directory
unless --work-path); their own error is "criu failed: type NOTIFY errno 0" and a second
line naming the log, which says nothing a node operator can act on. The log's text
holds paths and names from the container: it is read with a bound and printed as data.
"""

from __future__ import annotations

import os
import re

from ..errors import ImageError
from ..host.safefiles import read_bounded

DUMP_LOG = "dump.log"
RESTORE_LOG = "restore.log"  # runc's and crun's name for CRIU's log of a restore, in the work directory
# CRIU's last line of a dump that finished; its log quotes paths the container chose (newlines too)
_DUMP_DONE = re.compile(rb"\(\s*[\d.]+\) Dumping finished successfully")
MAX_LOG_BYTES = 256 << 20
MAX_REASON_CHARS = 300
# "(00.202653) Error (criu/files-reg.c:1790): Can't lookup mount=27 for fd=3 path=/tmp/x"
# (a restore's lines name the task after the time: "(00.291325)    348: Error (criu/files-reg.c:2258): ...")
_ERROR = re.compile(rb"^\(\s*[\d.]+\)(?:\s+\d+:)? Error \([^)]*\): (.*)$", re.MULTILINE)
# What CRIU says after the cause: the summary lines of its failed steps; and what it says that is never
# the cause (a helper's exit status, the descriptor limit it could not raise as it likes)
# A line's time since CRIU began; CRIU writes them in order, so an earlier one after a later one was made by a
# name from the container (a name cannot know CRIU's times to the microsecond)
_STAMP = re.compile(rb"^\(\s*(\d+)\.(\d+)\)(?:\s+(\d+):)? ", re.MULTILINE)
_SUMMARY = re.compile(rb"^(Dumping FAILED\.|Restoring FAILED\.|.* failed with -?\d+|Dumping .* failed|"
                      rb"-?\d+ exited, status=-?\d+|exited, status=-?\d+|`- Can't open vma|cg: cgroupd: .*"
                      rb"|rlimit: Can't setup RLIMIT_NOFILE for self: .*)$")


def dump_log_path(work_dir: str) -> str:
    return os.path.join(work_dir, DUMP_LOG)


def _read(work_dir: str, since: float, name: str = DUMP_LOG) -> bytes | None:
    path = os.path.join(work_dir, name)
    try:
        if os.lstat(path).st_mtime < since:
            return None  # an earlier dump's log
        return read_bounded(path, MAX_LOG_BYTES, path)
    except (OSError, ImageError):
        return None


def dump_finished(work_dir: str, since: float) -> bool:
    """CRIU's log in `work_dir`, written after `since` (time.time()), ends with its line saying the dump finished."""
    text = _read(work_dir, since)
    return text is not None and _DUMP_DONE.fullmatch(text.rstrip(b"\n").rsplit(b"\n", 1)[-1]) is not None


def _in_order(text: bytes) -> bool:
    """Every stamped line's time is at least the one before it of the same task's (a restore's tasks write their
    lines, each named after the time, into one log as they go: only each task's own are in order)."""
    last: dict[bytes, int] = {}
    for match in _STAMP.finditer(text):
        stamp = int(match.group(1)) * 1_000_000 + int(match.group(2)[:6].ljust(6, b"0"))
        task = match.group(3) or b""
        if stamp < last.get(task, -1):
            return False
        last[task] = stamp
    return True


def criu_failure(work_dir: str, since: float, name: str = DUMP_LOG) -> str:
    """CRIU's cause of a failed dump (`name`: restore.log, of a restore) written after `since`, as "; CRIU: ..."
    for a one-line message ("" if none): its first error that is not a step's summary of one before it."""
    text = _read(work_dir, since, name)
    if not text:
        return ""
    causes = [match.group(1).strip() for match in _ERROR.finditer(text)]
    causes = [cause for cause in causes if not _SUMMARY.match(cause)]
    if not causes:
        return ""
    path = os.path.join(work_dir, name)
    if not _in_order(text):
        return f"; CRIU's log holds lines out of its time order, made by names from the container: read it ({path})"
    cause = causes[0] if name == RESTORE_LOG else causes[-1]  # a restore's first error is why its tasks then fail
    reason = "".join(char if char.isprintable() else "?" for char in cause.decode(errors="replace"))
    return f"; CRIU: {reason[:MAX_REASON_CHARS]} ({path})"
