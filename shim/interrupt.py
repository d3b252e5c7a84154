"""Terminating signals while the shim holds CUDA processes locked: a flag, checked between phases.

Inside `deferred_signals()` SIGTERM, SIGINT and SIGHUP only set the flag (the first one
is kept), as runc takes signals on a channel: no step is ever cut in the middle. The
verb checks the flag at its phase boundaries (`check` raises Interrupted there) and
rolls back from what its journal says was done; a rollback or a completing step runs
to its end whatever arrives meanwhile.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

from ..errors import GpuckptError

TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(GpuckptError):
    """A terminating signal arrived; raised at the next phase boundary."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_status = 128 + signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


class SignalFlag:
    """The first terminating signal received, if any."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def note(self, signum: int | None) -> None:
        """Record a signal (from the handler, or one the delegate's run remembered)."""
        if self.signum is None and signum is not None:
            self.signum = signum

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.note(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def check(self) -> None:
        """A phase boundary: raise Interrupted if a signal arrived."""
        if self.signum is not None:
            raise Interrupted(self.signum)


@contextlib.contextmanager
def deferred_signals() -> Iterator[SignalFlag]:
    """Terminating signals set the yielded flag for the block; the caller's handlers after."""
    flag = SignalFlag()
    previous = {sig: signal.signal(sig, flag._handle) for sig in TERMINATING}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
