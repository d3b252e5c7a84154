"""Transparent hugepages `always` while the shim moves GPU state, if the operator opts in.

The driver's host buffers are ordinary anonymous memory of the target process and
first-touch page faults dominate the device-to-host move; 2 MiB pages made a 16 GB
checkpoint 1.35x and its restore 1.6x faster on an H100 (integration/gpu/results).
The setting is node-wide, so it is changed only with `cuda.host_hugepages = "always"`,
only for the duration, and concurrent shims share one change through a counted lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

from gpuckpt.node.paths import state_dir

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def current_mode(path: str = THP_ENABLED) -> str:
    """The bracketed word of the sysfs file: always, madvise or never."""
    with open(path) as setting:
        text = setting.read()
    return text.split("[", 1)[1].split("]", 1)[0]


@contextlib.contextmanager
def hugepages_always(wanted: bool, path: str = THP_ENABLED) -> Iterator[None]:
    """Set THP to `always` for the block (if `wanted`), then put back what the node had."""
    if not wanted or not os.path.exists(path):
        yield
        return
    os.makedirs(state_dir(), mode=0o700, exist_ok=True)
    record = os.path.join(state_dir(), "thp.holders")
    with open(os.path.join(state_dir(), "thp.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        holders, saved = _read_record(record)
        if holders == 0:
            saved = current_mode(path)
            _write(path, "always")
        _write_record(record, holders + 1, saved)
        fcntl.flock(lock, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_EX)
            holders, saved = _read_record(record)
            if holders <= 1:
                _write(path, saved or "madvise")
            _write_record(record, max(holders - 1, 0), saved)
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_record(record: str) -> tuple[int, str]:
    try:
        with open(record) as holders_file:
            count, saved = holders_file.read().split()
        return int(count), saved
    except (OSError, ValueError):
        return 0, ""


def _write_record(record: str, holders: int, saved: str) -> None:
    with open(record, "w") as holders_file:
        holders_file.write(f"{holders} {saved}\n")


def _write(path: str, mode: str) -> None:
    with open(path, "w") as setting:
        setting.write(mode)
