"""Starting other programs: gpuckpt's one subprocess seam.

Callers get a finished run's output or a CommandError whose message is one line
naming the program and its last line of stderr.
"""

from __future__ import annotations

import os
from gpuckpt.errors import GpuckptError

TYPE_CHECKING = False  # typing's own flag costs an import on the shim's start-up path
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping, Sequence

# `subprocess` is imported inside the functions: the shim's pass-through only execs.


class CommandError(GpuckptError):
    """A program could not be started, timed out, or exited non-zero."""

    def __init__(self, message: str, returncode: int = 1) -> None:
        super().__init__(message)
        self.returncode = returncode


class Finished:
    """A program that ran to its end."""

    __slots__ = ("returncode", "stdout", "stderr")

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def exec_program(path: str, argv: Sequence[str]) -> None:
    """Replace this process with `path` (argv[0] is `path`); returns only by raising."""
    try:
        os.execv(path, [path, *argv])
    except OSError as error:
        raise CommandError(f"cannot run {path}: {error.strerror}") from None


def spawn(argv: Sequence[str]) -> subprocess.Popen:
    """Start a child sharing our stdio and every inherited fd (engines pass fds to runtimes)."""
    import subprocess

    try:
        return subprocess.Popen(list(argv), close_fds=False)
    except OSError as error:
        raise CommandError(f"cannot run {argv[0]}: {error.strerror}") from None


def run(argv: Sequence[str], *, timeout_s: float = 120, check: bool = True,
        env: Mapping[str, str] | None = None, input_text: str | None = None) -> Finished:
    """Run to the end with output captured; with `check`, a non-zero exit is a CommandError."""
    import subprocess

    name = os.path.basename(argv[0])
    try:
        completed = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                                   env=dict(env) if env is not None else None, input=input_text,
                                   stdin=None if input_text is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise CommandError(f"{name}: not found (is it installed and on PATH?)", 127) from None
    except OSError as error:
        raise CommandError(f"cannot run {name}: {error.strerror}") from None
    except subprocess.TimeoutExpired:
        raise CommandError(f"{name} {' '.join(argv[1:3])}: no answer within {timeout_s:g} s") from None
    finished = Finished(completed.returncode, completed.stdout, completed.stderr)
    if check:
        _raise_if_failed(name, argv, finished)
    return finished


def _raise_if_failed(name: str, argv: Sequence[str], finished: Finished) -> None:
    """A non-zero exit as a CommandError carrying the program's last line of output."""
    if finished.returncode != 0:
        detail = (finished.stderr.strip().splitlines() or finished.stdout.strip().splitlines() or ["no message"])[-1]
        raise CommandError(f"{name} {' '.join(argv[1:3])}: {detail}", finished.returncode)


class Background:
    """A program running beside us, its output kept in private files until it ends."""

    def __init__(self, argv: Sequence[str]) -> None:
        import subprocess
        import tempfile

        self.name = os.path.basename(argv[0])
        self.argv = list(argv)
        self._out = tempfile.TemporaryFile()
        self._err = tempfile.TemporaryFile()
        try:
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err)
        except OSError as error:
            raise CommandError(f"cannot run {self.name}: {error.strerror}") from None

    def running(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.running():
            self.popen.kill()
        self.popen.wait()

    def wait(self, check: bool = True) -> Finished:
        returncode = self.popen.wait()
        outputs = []
        for kept in (self._out, self._err):
            kept.seek(0)
            outputs.append(kept.read().decode(errors="replace"))
            kept.close()
        finished = Finished(returncode, outputs[0], outputs[1])
        if check:
            _raise_if_failed(self.name, self.argv, finished)
        return finished


def find_program(name: str, skip: str | None = None) -> str | None:
    """Look `name` up on PATH like execvp, never returning the shim itself (`skip`)."""
    if "/" in name:
        return name if os.access(name, os.X_OK) and not os.path.isdir(name) else None
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            if skip and os.path.realpath(candidate) == skip:
                continue
            return os.path.abspath(candidate)
    return None
