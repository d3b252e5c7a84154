"""A verb's rollback as a structure: each step registers its undo as it is done, and a failure runs
them newest first (STYLE rule 3), so no path can forget one.

An undo returns what it could not put back, one line each; the verb's error names them. The journal
on disk (node/journal.py) is the same story for a shim killed outright: shim/recover.py finishes it.
"""

from __future__ import annotations

from collections.abc import Callable

Undo = Callable[[], list[str]]


class Rollback:
    def __init__(self) -> None:
        self._undos: list[tuple[str, Undo]] = []

    def done(self, step: str, undo: Undo) -> None:
        """`step` is done (or begun: its undo copes with any part of it); `undo` puts it back."""
        self._undos.append((step, undo))

    def forget(self) -> None:
        """Nothing is to be undone any more: what was done stays."""
        self._undos.clear()

    def run(self) -> list[str]:
        """Undo every step, the newest first; what could not be put back."""
        left: list[str] = []
        while self._undos:
            _, undo = self._undos.pop()
            left.extend(undo())
        return left
