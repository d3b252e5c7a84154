"""Finding a program on PATH and becoming it: the part of the subprocess seam on the shim's
pass-through path (every container operation), so it imports nothing but `os`.
"""

from __future__ import annotations

import os

from ..errors import GpuckptError

TYPE_CHECKING = False  # typing's own flag costs an import on the shim's start-up path
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn


class CommandError(GpuckptError):
    """A program could not be started, timed out, or exited non-zero."""

    def __init__(self, message: str, returncode: int = 1) -> None:
        super().__init__(message)
        self.returncode = returncode


def exec_program(path: str, argv: Sequence[str]) -> NoReturn:
    """Replace this process with `path` (argv[0] is `path`); returns only by raising."""
    try:
        os.execv(path, [path, *argv])
    except OSError as error:
        raise CommandError(f"cannot run {path}: {error.strerror}") from None


def find_program(name: str, skip: str | None = None) -> str | None:
    """Look `name` up on PATH like execvp (its absolute entries only), never returning the shim itself (`skip`)."""
    if "/" in name:
        return name if os.access(name, os.X_OK) and not os.path.isdir(name) else None
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not os.path.isabs(directory):
            continue  # the working directory (an empty entry, "."): not for root (Go's LookPath: ErrDot)
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            if skip and os.path.realpath(candidate) == skip:
                continue
            return os.path.abspath(candidate)
    return None
