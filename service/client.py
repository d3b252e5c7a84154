"""The `gpuckpt` CLI's side of gpuckptd's socket: one request, the events as they come."""

from __future__ import annotations

import socket
from collections.abc import Iterator

from ..errors import GpuckptError
from .api import MAX_LINE_BYTES, Event, Request, parse_event


def request(path: str, wanted: Request, timeout_s: float | None = None) -> Iterator[Event]:
    """Send `wanted` to the service at `path`; yield each event until it closes the connection
    (`timeout_s`: the longest wait for any one line; None waits as long as the work takes)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    connection.settimeout(timeout_s)
    try:
        connection.connect(path)
    except OSError as error:  # TimeoutError among them
        connection.close()
        raise GpuckptError(f"gpuckptd is not answering on {path}: {error.strerror or error}; start it: "
                           "`systemctl start gpuckptd`, or where systemd is not PID 1 `gpuckptd` in the foreground "
                           "(a terminal or another supervisor; gpuckptd --help)") from None
    with connection, connection.makefile("rb") as lines:
        connection.sendall(wanted.model_dump_json().encode() + b"\n")
        for line in lines:
            if len(line) > MAX_LINE_BYTES:
                raise GpuckptError(f"gpuckptd sent a line longer than {MAX_LINE_BYTES} bytes")
            yield parse_event(line)
