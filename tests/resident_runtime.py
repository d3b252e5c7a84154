#!/usr/bin/env python3
"""A runc stand-in for tests/test_resident.py: records, per verb, who started it and how.

$REC_DIR/<verb>.json gets its argv, PID, parent, working directory, umask and $REC_MARK, and the
children of $REC_HELPER (the resident helper) with their working directory and umask: a worker
working the verb shows there. It writes a line to stdout and one to stderr, and exits with
$REC_STATUS; the verb named by $REC_SLEEP instead sleeps until SIGTERM, which it records in
$REC_DIR/signal, then exits 0.3 s later as a shell reports it (143).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (scanned: not every kernel has /proc/PID/task/TID/children)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except OSError:
            pass  # ended while we looked
    return found


def seen(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    umask = next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:"))
    return {"pid": pid, "cwd": os.readlink(f"/proc/{pid}/cwd"), "umask": int(umask, 8)}


def main() -> int:
    verb = next(arg for arg in sys.argv[1:] if arg in ("state", "delete", "checkpoint", "restore", "kill"))
    records = Path(os.environ["REC_DIR"])
    workers = []
    for pid in children_of(int(os.environ["REC_HELPER"])) if "REC_HELPER" in os.environ else []:
        try:
            workers.append(seen(pid))
        except OSError:
            pass  # a worker that ended meanwhile (the fixture's probe)
    (records / f"{verb}.json").write_text(json.dumps({
        **seen(os.getpid()), "argv": sys.argv[1:], "ppid": os.getppid(), "mark": os.environ.get("REC_MARK"),
        "workers": workers}))
    print(f"{verb} out", flush=True)
    sys.stderr.write(f"{verb} err\n")
    if verb == os.environ.get("REC_SLEEP"):
        def record_signal(signum: int, _frame: object) -> None:
            (records / "signal").write_text(signal.Signals(signum).name)
            time.sleep(0.3)  # a delegate winding down: whoever waits for its end must not go on without it
            sys.exit(128 + signum)

        signal.signal(signal.SIGTERM, record_signal)
        (records / "ready").write_text("")
        time.sleep(10)
    return int(os.environ.get("REC_STATUS", "0"))


if __name__ == "__main__":
    sys.exit(main())
