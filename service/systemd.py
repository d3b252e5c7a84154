"""gpuckptd's side of systemd, through python-systemd: sd_notify (READY, STATUS, WATCHDOG,
STOPPING) and journal entries with one field per fact (CONTAINER_ID, ENGINE, PHASE, BYTES,
SECONDS). Outside systemd (no journal socket) the same entries go to stderr as one line each.
"""

from __future__ import annotations

import os
import sys

from systemd import daemon, journal

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "gpuckptd"


def notify(*assignments: str) -> None:
    """sd_notify("READY=1", "STATUS=..."); nothing when systemd did not ask (no NOTIFY_SOCKET)."""
    daemon.notify("\n".join(assignments))


def watchdog_interval_s() -> float | None:
    """Half the watchdog period systemd set for us (WatchdogSec=), or None."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", str(os.getpid()))
    return int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and pid == str(os.getpid()) else None


def log(message: str, *, priority: int = journal.LOG_INFO, **fields: object) -> None:
    """One entry: `message`, and each field upper-cased (CONTAINER_ID=..., BYTES=...)."""
    named = {key.upper(): str(value) for key, value in fields.items() if value is not None}
    if os.path.exists(JOURNAL_SOCKET):
        journal.send(message, PRIORITY=str(priority), SYSLOG_IDENTIFIER=IDENTIFIER, **named)
        return
    detail = " ".join(f"{key}={value}" for key, value in named.items())
    sys.stderr.write(f"{IDENTIFIER}: {message}{f' ({detail})' if detail else ''}\n")
    sys.stderr.flush()
