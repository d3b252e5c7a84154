"""A restored checkpoint's large files freed after the restore, not during it.

Once a restore succeeded, podman removes the checkpoint (unless `--keep`) before its
`container restore` returns, and the last unlink of a multi-GB pages image is the
filesystem freeing every block and the page cache dropping every page: 1.4 s of a 2.8 s
restore of a 2 GB container on the CI machine. A holder process keeps each large file of
the image directory open through an O_PATH descriptor, so the engine's unlink only drops a
name; the holder closes a file once the engine removed it (or after HOLD_S, when the engine
keeps the checkpoint), and the freeing happens there, after the container runs. It also ends
when the restored container's init does (a pidfd): an engine whose monitor is a subreaper
(conmon) adopts the holder, and waits for its children before it exits.

O_PATH opens nothing (no FIFO waits, no device's open), O_NOFOLLOW holds no link's target,
and only regular files are held. Run as a script (`python -I -S deferred_free.py HOLD_S UNTIL_FD FD...`),
the holder imports nothing of gpuckpt.
"""

from __future__ import annotations

import os
import select
import stat
import sys
import time

LARGE_BYTES = 64 << 20  # smaller files free in well under a millisecond: not worth a process
MAX_HELD = 64  # CRIU writes one pages image per process; more than this is no image of ours
MAX_ENTRIES = 4096  # entries of the image directory looked at, at most
HOLD_S = 10.0  # podman removes the checkpoint right after the runtime returned
POLL_S = 0.05


def open_large_files(directory: str, min_bytes: int = LARGE_BYTES) -> list[int]:
    """O_PATH descriptors (not inheritable) of the regular files of at least `min_bytes` directly in
    `directory`, at most MAX_HELD; none when it cannot be read."""
    held: list[int] = []
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return held
    try:
        with os.scandir(dir_fd) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_ENTRIES or len(held) >= MAX_HELD:
                    break
                try:
                    fd = os.open(entry.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    info = os.fstat(fd)
                except OSError:
                    os.close(fd)
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_size >= min_bytes and info.st_nlink > 0:
                    held.append(fd)
                else:
                    os.close(fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return held


def holder_argv(fds: list[int], until_fd: int, hold_s: float = HOLD_S) -> list[str]:
    """The holder's command line: this file run by our interpreter, isolated, without site-packages;
    `until_fd` a pidfd of the process whose end ends the hold (-1: none)."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), f"{hold_s:g}", str(until_fd), *map(str, fds)]


def hold(fds: list[int], hold_s: float, until_fd: int = -1, poll_s: float = POLL_S) -> None:
    """Close each descriptor once its file has no name left (the engine removed it: the freeing
    happens in this close), the rest after `hold_s` or once the process of `until_fd` ended."""
    waiting = list(fds)
    deadline = time.monotonic() + hold_s
    ended = select.poll()
    if until_fd >= 0:
        ended.register(until_fd, select.POLLIN)  # a pidfd is readable once its process ended
    while waiting and time.monotonic() < deadline:
        for fd in list(waiting):
            if os.fstat(fd).st_nlink == 0:
                os.close(fd)
                waiting.remove(fd)
        if ended.poll(poll_s * 1000):
            break
    for fd in waiting:
        os.close(fd)


def main(argv: list[str]) -> int:
    try:
        hold_s, until_fd, fds = float(argv[0]), int(argv[1]), [int(fd) for fd in argv[2:]]
        hold(fds, min(hold_s, 600.0), until_fd)
    except (IndexError, ValueError, OSError) as error:
        print(f"deferred_free: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
