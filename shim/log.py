"""The shim's messages, written where runc writes its own.

With `--log FILE --log-format json` runc appends logrus JSON lines (level, msg,
time) that podman and containerd show to the user; errors also go to stderr.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from typing import TYPE_CHECKING, BinaryIO

from .argv import RuntimeArgs

if TYPE_CHECKING:
    import threading


def _timestamp() -> str:
    """Local time in RFC 3339, as logrus writes it: containerd decodes `time` as RFC 3339 and
    drops a line whose offset lacks the colon (+0100)."""
    now = time.localtime()
    offset = time.strftime("%z", now)
    zone = "Z" if offset in ("+0000", "-0000") else f"{offset[:3]}:{offset[3:]}"
    return time.strftime("%Y-%m-%dT%H:%M:%S", now) + zone


def format_line(level: str, message: str, log_format: str) -> str:
    if log_format == "json":
        return json.dumps({"level": level, "msg": message, "time": _timestamp()})
    return f'time="{_timestamp()}" level={level} msg={json.dumps(message)}'


def log(args: RuntimeArgs, level: str, message: str) -> None:
    """Append one line to runc's log (stderr when no --log was given)."""
    if level == "debug" and not args.debug:
        return
    line = format_line(level, message, args.log_format) + "\n"
    if args.log_path:
        try:
            with open(args.log_path, "a", encoding="utf-8") as log_file:
                log_file.write(line)
            return
        except OSError:
            pass
    sys.stderr.write(line)


# A delegate's stderr held back (DelegateRun with hold_stderr): written after the shim's own error
# line, or on its own once the verb ends without one. Bounded: the rest is read and dropped.
MAX_HELD_STDERR = 1 << 20
_held: list[bytes] = []


def hold_stderr(stream: BinaryIO, ended: threading.Event) -> None:
    """Read `stream` (a delegate's stderr pipe) as it comes, holding what fits, to its end or, once
    `ended` (the delegate has exited), to what is in the pipe: a helper the delegate left running
    (CRIU's action scripts, a lazy-pages server) may hold it open long after."""
    fd, size = stream.fileno(), 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        ending = ended.is_set()
        if not poller.poll(0 if ending else 50):
            if ending:
                break  # the delegate's words are all read: what is left is a helper's
            continue
        chunk = os.read(fd, 65536)
        if not chunk or size >= MAX_HELD_STDERR and ending:
            break
        if size < MAX_HELD_STDERR:
            _held.append(chunk[:MAX_HELD_STDERR - size])
        size += len(chunk)
    stream.close()


def release_stderr() -> None:
    """Write what delegates' stderr held, once."""
    if _held:
        sys.stderr.flush()
        sys.stderr.buffer.write(b"".join(_held))
        sys.stderr.buffer.flush()
        _held.clear()


def drop_held_stderr() -> None:
    """Forget what delegates' stderr held: an attempt the shim undid and makes again (its words would read as
    the outcome's)."""
    _held.clear()


def report_error(args: RuntimeArgs, message: str) -> None:
    """An error as runc reports one: to its log, and the bare line on stderr, first (before what the
    delegate said, which it explains)."""
    if args.log_path:
        log(args, "error", message)
    sys.stderr.write(f"{message}\n")
    release_stderr()
