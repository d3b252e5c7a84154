"""Reading other processes' state from /proc: what their file descriptors point at.

Processes come and go while we look: anything that vanished is skipped, never an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator


def fd_targets(pids: Iterable[int]) -> Iterator[tuple[int, str]]:
    """(pid, target) for every open fd of `pids`: "/dev/nvidia0", "socket:[1234]", ..."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                yield pid, os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
