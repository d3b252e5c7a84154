"""Named pipes between gpuckpt and an engine that wants a file path (podman's --export/--import).

Opening a FIFO blocks until the other side opens it; if the engine fails before it
ever does, the wait is ended by opening the other side ourselves, so nothing hangs.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress


@contextmanager
def private_fifo(prefix: str) -> Iterator[str]:
    """A FIFO in a new root-only directory, removed afterwards."""
    directory = tempfile.mkdtemp(prefix=prefix)
    path = os.path.join(directory, "stream.tar")
    os.mkfifo(path, 0o600)
    try:
        yield path
    finally:
        os.unlink(path)
        os.rmdir(directory)


def open_when_peer(path: str, writing: bool, peer_alive: Callable[[], bool]) -> int | None:
    """Open our end of the FIFO once the peer opens its end; None if the peer ended first."""
    flags = (os.O_WRONLY if writing else os.O_RDONLY) | os.O_CLOEXEC
    opened: list[int] = []
    opener = threading.Thread(target=lambda: opened.append(os.open(path, flags)), daemon=True)
    opener.start()
    while opener.is_alive():
        opener.join(0.05)
        if opener.is_alive() and not peer_alive():
            time.sleep(0.2)  # it may have opened and exited at once
            if not opener.is_alive():
                break
            # stand in for the peer that will never come, to release the blocked open
            other = os.open(path, (os.O_RDONLY if writing else os.O_WRONLY | os.O_NONBLOCK) | os.O_CLOEXEC)
            opener.join()
            os.close(other)
            os.close(opened.pop())
            return None
    return opened[0] if opened else None


PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named in Python only from 3.10 on some builds


def widen(fd: int) -> None:
    """A 1 MiB pipe buffer instead of 64 KiB: fewer, larger reads and writes for GiBs of pages.
    Best effort: above /proc/sys/fs/pipe-max-size an unprivileged caller is refused, and that is fine."""
    with suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
