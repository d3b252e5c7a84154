"""Transparent hugepages `always` while the shim moves GPU state (`cuda.host_hugepages`, the default).

The driver's host buffers are ordinary anonymous memory of the target process and
first-touch page faults dominate the device-to-host move; 2 MiB pages made a 16 GiB
checkpoint 1.5x, its restore 1.6x and a suspend 2.2x faster on an H100
(results/gpu/gpu_tests-suspend-hugepages-h100.json). The setting is
node-wide, so it is changed only while GPU state moves ("leave" never touches it), and
concurrent shims share one change: the record names each live holder (PID and start
time), so a shim killed while it held the setting counts no more, and the next shim,
whether it wants hugepages or not, puts back what the node had.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator

from ..host.procfs import start_time
from ..node.paths import state_dir, thp_enabled_path


def current_mode(path: str | None = None) -> str:
    """The bracketed word of the sysfs file: always, madvise or never."""
    with open(path or thp_enabled_path()) as setting:
        text = setting.read()
    if "[" not in text:  # a plain file standing in for sysfs holds the word last written
        return text.strip()
    return text.split("[", 1)[1].split("]", 1)[0]


@contextlib.contextmanager
def hugepages_always(wanted: bool, path: str | None = None) -> Iterator[None]:
    """Set THP to `always` for the block (if `wanted`), then put back what the node had."""
    path = path or thp_enabled_path()
    if not os.path.exists(path):
        yield
        return
    record = os.path.join(state_dir(), "thp.holders")
    if not wanted:
        if os.path.exists(record):
            with _locked():
                _hold(record, path, _live_holders(record))  # what a killed holder left
        yield
        return
    me = _me()
    with _locked():
        _hold(record, path, [*_live_holders(record), me])
    try:
        yield
    finally:
        with _locked():
            holders = _live_holders(record)
            if me in holders:
                holders.remove(me)  # one entry: a process may hold it twice (nested)
            _hold(record, path, holders)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    os.makedirs(state_dir(), mode=0o700, exist_ok=True)
    with open(os.path.join(state_dir(), "thp.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file lets go of the lock


def _me() -> list[int]:
    return [os.getpid(), start_time(os.getpid()) or 0]


def _read_record(record: str) -> tuple[list[list[int]], str]:
    """The holders and the mode the node had before the first; none and "" without a record."""
    try:
        with open(record) as holders_file:
            text = holders_file.read()
    except OSError:
        return [], ""
    try:
        found = json.loads(text)
        return [[int(pid), int(since)] for pid, since in found["holders"]], str(found["saved"])
    except (ValueError, KeyError, TypeError):
        pass
    words = text.split()  # an older shim's "COUNT SAVED": its holders unknown, what the node had kept
    return [], words[1] if len(words) == 2 and words[1] in ("always", "madvise", "never") else ""


def _live_holders(record: str) -> list[list[int]]:
    holders, _ = _read_record(record)
    return [[pid, since] for pid, since in holders if start_time(pid) == since]


def _hold(record: str, path: str, holders: list[list[int]]) -> None:
    """Make the node's setting and the record agree with `holders` (the caller holds the lock)."""
    _, saved = _read_record(record)
    if holders:
        if not saved:  # the first holder: keep what the node had
            saved = current_mode(path)
            _write(path, "always")
        _write_record(record, holders, saved)
        return
    if saved:
        _write(path, saved)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record)


def _write_record(record: str, holders: list[list[int]], saved: str) -> None:
    with open(record, "w") as holders_file:
        holders_file.write(json.dumps({"saved": saved, "holders": holders}) + "\n")


def _write(path: str, mode: str) -> None:
    with open(path, "w") as setting:
        setting.write(mode)
