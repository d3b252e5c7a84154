"""Terminating signals while the shim holds CUDA processes locked.

Inside `interruptible()` SIGTERM, SIGINT and SIGHUP raise KeyboardInterrupt so
the caller unwinds into its rollback; inside `uninterruptible()` they are only
remembered, so a rollback always runs to its end.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _handled_by(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    previous = {sig: signal.signal(sig, handler) for sig in TERMINATING}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def interruptible() -> contextlib.AbstractContextManager[None]:
    return _handled_by(_raise)


def uninterruptible() -> contextlib.AbstractContextManager[None]:
    return _handled_by(lambda _signum, _frame: None)
