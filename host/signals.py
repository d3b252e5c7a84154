"""SIGTERM and SIGHUP unwound as Ctrl-C is, except while an engine works (`termination_deferred`).

`gpuckpt import` killed mid-way left its staging directory (hundreds of MB). Raising at the signal
runs every `finally`; but subprocess kills (SIGKILL) a program it was waiting for when an exception
goes through it, and a podman restore killed mid-way can leave its container half made. So the
signal waits while podman works, and the unwinding starts once it is done.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, unwound as Ctrl-C is: every `finally` runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminated(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(signum)


def unwind_at_termination() -> None:
    for terminating in TERMINATING:
        signal.signal(terminating, _terminated)


@contextlib.contextmanager
def termination_deferred() -> Iterator[None]:
    """A terminating signal during the block is kept, and raised as Terminated once the block is over."""
    received: list[int] = []
    previous = {int(sig): signal.signal(sig, lambda signum, _frame: received.append(signum)) for sig in TERMINATING}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received and previous[received[0]] is _terminated:  # the command unwinds at termination: now it may
        raise Terminated(received[0])
