"""A call run on a thread of its own, its outcome handed back to the thread that asks for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class OnThread(Generic[T]):
    """`call()` started at once on a daemon thread; `result()` waits for it and returns what it returned, or
    raises what it raised, in the caller's thread."""

    def __init__(self, call: Callable[[], T], name: str) -> None:
        self._value: list[T] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._value.append(call())
        except BaseException as error:  # noqa: BLE001 -- not handled here: result() raises it in the caller's thread
            self._error = error

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value[0]
