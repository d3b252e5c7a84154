"""Starting other programs: gpuckpt's one subprocess seam.

Finding a program and becoming it live in host/programs.py, light enough for the shim's
pass-through; this module is for the verbs and the CLI, which wait for what they start.

Callers get a finished run's output or a CommandError whose message is one line
naming the program and its last line of stderr.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from gpuckpt.host import caller
from gpuckpt.host.programs import CommandError

__all__ = ["Background", "CommandError", "Finished", "run", "spawn"]  # CommandError: raised by both


class Finished:
    """A program that ran to its end."""

    __slots__ = ("returncode", "stdout", "stderr")

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


Child = subprocess.Popen | caller.CallerChild  # what spawn() hands back: ours, or the caller's (host/caller.py)


def spawn(argv: Sequence[str], *, pipe_stderr: bool = False) -> Child:
    """Start a child sharing our stdio and every inherited fd (engines pass fds to runtimes); with
    `pipe_stderr`, its stderr comes to us through a pipe instead. In a resident worker the child is
    the calling gpuckpt-runtime's (host/caller.py), its stdio and fds."""
    starter = caller.current()
    if starter is not None:
        try:
            return _spawn_by(starter, argv, None, stdin=False, capture=False, pipe_stderr=pipe_stderr)
        except OSError as error:
            raise CommandError(f"cannot run {argv[0]}: {error.strerror}") from None
    try:
        return subprocess.Popen(list(argv), close_fds=False, stderr=subprocess.PIPE if pipe_stderr else None)
    except OSError as error:
        raise CommandError(f"cannot run {argv[0]}: {error.strerror}") from None


def run(argv: Sequence[str], *, timeout_s: float = 120, check: bool = True,
        env: Mapping[str, str] | None = None, input_text: str | None = None) -> Finished:
    """Run to the end with output captured; with `check`, a non-zero exit is a CommandError."""
    name = os.path.basename(argv[0])
    starter = caller.current()
    if starter is not None:
        finished = _run_by(starter, name, argv, timeout_s, env, input_text)
        if check:
            _raise_if_failed(name, argv, finished)
        return finished
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


def _spawn_by(starter: caller.Caller, argv: Sequence[str], env: Mapping[str, str] | None, *, stdin: bool,
              capture: bool, pipe_stderr: bool) -> caller.CallerChild:
    """`argv` started by the caller, with pipes to us where asked (stdin: /dev/null unless `stdin`)."""
    ours: list[tuple[str, int, str]] = []  # (attribute, our end, mode)
    theirs: dict[str, int] = {}
    try:
        if stdin:
            read_end, write_end = os.pipe()
            ours.append(("stdin", write_end, "wb"))
            theirs["stdin"] = read_end
        elif capture:
            theirs["stdin"] = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        for attribute, wanted in (("stdout", capture), ("stderr", capture or pipe_stderr)):
            if wanted:
                read_end, write_end = os.pipe()
                ours.append((attribute, read_end, "rb"))
                theirs[attribute] = write_end
        child = starter.spawn(argv, env=env, close_fds=capture, **theirs)  # run()'s, as subprocess.run's
    except BaseException:
        for _, fd, _ in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs.values():
            os.close(fd)
    for attribute, fd, mode in ours:
        setattr(child, attribute, os.fdopen(fd, mode, buffering=0))
    return child


def _run_by(starter: caller.Caller, name: str, argv: Sequence[str], timeout_s: float,
            env: Mapping[str, str] | None, input_text: str | None) -> Finished:
    """run() in a resident worker: the caller starts the program, we hold its pipes."""
    try:
        child = _spawn_by(starter, argv, env, stdin=input_text is not None, capture=True, pipe_stderr=False)
    except FileNotFoundError:
        raise CommandError(f"{name}: not found (is it installed and on PATH?)", 127) from None
    except OSError as error:
        raise CommandError(f"cannot run {name}: {error.strerror}") from None
    outputs = child.communicate(input_text.encode() if input_text is not None else None, timeout_s)
    if outputs is None:
        raise CommandError(f"{name} {' '.join(argv[1:3])}: no answer within {timeout_s:g} s")
    assert child.returncode is not None
    return Finished(child.returncode, outputs[0].decode(errors="replace"), outputs[1].decode(errors="replace"))


def _raise_if_failed(name: str, argv: Sequence[str], finished: Finished) -> None:
    """A non-zero exit as a CommandError carrying the program's last line of output."""
    if finished.returncode != 0:
        detail = (finished.stderr.strip().splitlines() or finished.stdout.strip().splitlines() or ["no message"])[-1]
        raise CommandError(f"{name} {' '.join(argv[1:3])}: {detail}", finished.returncode)


class Background:
    """A program running beside us, its output kept in private files until it ends."""

    def __init__(self, argv: Sequence[str]) -> None:
        # Deferred: tempfile (and shutil, bz2, random under it) costs ~7 ms, and the shim's verbs,
        # `delete` on every container's end among them, load this module but never run this class.
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
