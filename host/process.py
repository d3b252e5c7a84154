"""Starting other programs: gpuckpt's one subprocess seam.

Finding a program and becoming it live in host/programs.py, light enough for the shim's
pass-through; this module is for the verbs and the CLI, which wait for what they start.

Callers get a finished run's output or a CommandError whose message is one line
naming the program and its last line of stderr.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import BinaryIO, Protocol

from .programs import CommandError

MAX_CAUSE = 500  # characters of a runtime's logged error carried into the one line
MAX_LOGGED_LINE = 64 << 10  # longer lines are not looked into
_LOGRUS_ERROR = re.compile(r'\blevel=error msg=("(?:[^"\\]|\\.)*")')

# CommandError: raised by both
__all__ = ["Background", "CommandError", "Finished", "Running", "run", "spawn", "start_detached", "wait_within"]


class Finished:
    """A program that ran to its end."""

    __slots__ = ("returncode", "stdout", "stderr")

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


class StartedChild(Protocol):
    """A program another process started for us and lets us watch (shim/resident/caller.py's CallerChild)."""

    pid: int
    returncode: int | None
    stdin: BinaryIO | None
    stdout: BinaryIO | None
    stderr: BinaryIO | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, signum: int) -> None: ...

    def kill(self) -> None: ...

    def communicate(self, input_bytes: bytes | None, timeout_s: float) -> tuple[bytes, bytes] | None: ...


class Starter(Protocol):
    """Who starts this process's programs when it is not us: a resident worker's caller (shim/resident/
    caller.py), whose children they must be."""

    pid: int  # the caller's: the gpuckpt-runtime process the engine started

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: int | None = None,
              stdout: int | None = None, stderr: int | None = None, close_fds: bool = False) -> StartedChild: ...


Child = subprocess.Popen[bytes] | StartedChild  # what spawn() hands back: ours, or the starter's


def wait_within(child: Child, timeout_s: float | None) -> int:
    """The child's returncode once it ended; TimeoutError past `timeout_s`. Its end seen through a pidfd, at once:
    Popen.wait(timeout) polls, up to 50 ms late (a dump's end is the GPU's downtime)."""
    if timeout_s is not None and isinstance(child, subprocess.Popen) and child.returncode is None:
        pidfd = os.pidfd_open(child.pid)
        try:
            if not select.select([pidfd], [], [], timeout_s)[0]:
                raise TimeoutError(child.pid)
        finally:
            os.close(pidfd)
        return child.wait()
    if timeout_s is None or isinstance(child, subprocess.Popen):
        return child.wait()
    return child.wait(timeout_s)  # the starter's child: watched through its own pidfd
_starter: Starter | None = None


def caller_pid() -> int:
    """The gpuckpt-runtime process the engine started: this one, or the one a resident worker works for."""
    starter = _starter
    return starter.pid if starter is not None else os.getpid()


def start_programs_through(starter: Starter | None) -> None:
    """From now on this process's programs are started by `starter` (a resident worker, once; None: by us)."""
    global _starter
    _starter = starter


def spawn(argv: Sequence[str], *, pipe_stderr: bool = False) -> Child:
    """Start a child sharing our stdio and every inherited fd (engines pass fds to runtimes); with
    `pipe_stderr`, its stderr comes to us through a pipe instead. In a resident worker the child is
    the calling gpuckpt-runtime's (start_programs_through), its stdio and fds."""
    starter = _starter
    if starter is not None:
        try:
            return _spawn_by(starter, argv, None, stdin=False, capture=False, pipe_stderr=pipe_stderr)
        except OSError as error:
            raise CommandError(f"cannot run {argv[0]}: {error.strerror}") from None
    try:
        return subprocess.Popen(list(argv), close_fds=False, stderr=subprocess.PIPE if pipe_stderr else None)
    except OSError as error:
        raise CommandError(f"cannot run {argv[0]}: {error.strerror}") from None


def start_detached(argv: Sequence[str], pass_fds: Sequence[int]) -> int:
    """Start a program that outlives us and waits for no one: its own session, stdio on /dev/null, no
    descriptor of ours but `pass_fds` (an engine reading our output to its end never waits on it) and `/`
    as its directory (it pins no bundle or mount of ours).
    Started by us, never by a resident worker's caller: it must outlive the call. Its PID."""
    try:
        quiet = subprocess.DEVNULL
        return subprocess.Popen(list(argv), stdin=quiet, stdout=quiet, stderr=quiet, close_fds=True,
                                pass_fds=tuple(pass_fds), start_new_session=True, cwd="/").pid
    except OSError as error:
        raise CommandError(f"cannot run {argv[0]}: {error.strerror}") from None


def run(argv: Sequence[str], *, timeout_s: float = 120, check: bool = True,
        env: Mapping[str, str] | None = None, input_text: str | None = None) -> Finished:
    """Run to the end with output captured; with `check`, a non-zero exit is a CommandError."""
    return Running(argv, timeout_s=timeout_s, env=env, input_text=input_text).finish(check=check)


class Running:
    """run() in two steps: started here, its output read by finish(), so another can run meanwhile."""

    def __init__(self, argv: Sequence[str], *, timeout_s: float = 120, env: Mapping[str, str] | None = None,
                 input_text: str | None = None) -> None:
        self.name, self.argv = os.path.basename(argv[0]), list(argv)
        self.timeout_s, self.input_text = timeout_s, input_text
        self.deadline = time.monotonic() + timeout_s
        self.child: Child
        starter = _starter
        try:
            if starter is not None:
                self.child = _spawn_by(starter, argv, env, stdin=input_text is not None, capture=True,
                                       pipe_stderr=False)
            else:
                self.child = subprocess.Popen(
                    self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                    env=dict(env) if env is not None else None)
        except FileNotFoundError:
            raise CommandError(f"{self.name}: not found (is it installed and on PATH?)", 127) from None
        except OSError as error:
            raise CommandError(f"cannot run {self.name}: {error.strerror}") from None

    def finish(self, check: bool = True) -> Finished:
        """Its output once it ended; with `check`, a non-zero exit is a CommandError. Past its time it is
        killed and a CommandError says so."""
        input_bytes = self.input_text.encode() if self.input_text is not None else None
        left_s = max(self.deadline - time.monotonic(), 0)
        if left_s < 1 and self.child.poll() is not None:
            left_s = 1  # it ended in time, its output still in the pipes: read now, not taken for a timeout
        if isinstance(self.child, subprocess.Popen):
            try:
                stdout, stderr = self.child.communicate(input_bytes, timeout=left_s)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.communicate()
                outputs = None
            else:
                outputs = (stdout, stderr)
        else:
            outputs = self.child.communicate(input_bytes, left_s)
        if outputs is None:
            raise CommandError(f"{self.name} {' '.join(self.argv[1:3])}: no answer within {self.timeout_s:g} s")
        assert self.child.returncode is not None
        finished = Finished(self.child.returncode, outputs[0].decode(errors="replace"),
                            outputs[1].decode(errors="replace"))
        if check:
            _raise_if_failed(self.name, self.argv, finished)
        return finished


def _spawn_by(starter: Starter, argv: Sequence[str], env: Mapping[str, str] | None, *, stdin: bool,
              capture: bool, pipe_stderr: bool) -> StartedChild:
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


def _raise_if_failed(name: str, argv: Sequence[str], finished: Finished) -> None:
    """A non-zero exit as a CommandError carrying the program's last line of output, and the first error
    a runtime logged before it (podman ends with "...runtime... failed: exit status 1", the reason above;
    gpuckpt-runtime's own line comes before its delegate's)."""
    if finished.returncode != 0:
        lines = finished.stderr.strip().splitlines() or finished.stdout.strip().splitlines() or ["no message"]
        detail = lines[-1]
        if cause := next((message for line in lines[:-1] if (message := logged_error(line))), None):
            detail = f"{detail} ({cause})"
        raise CommandError(f"{name} {' '.join(argv[1:3])}: {detail}", finished.returncode)


def logged_error(line: str) -> str | None:
    """The message of an error-level line in runc's log formats (logrus text or JSON), bounded and printable
    (it may quote names a container chose: no newline or terminal escape of theirs reaches the one line);
    None for others."""
    line = line.strip()
    if len(line) > MAX_LOGGED_LINE:
        return None
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            return None
        message = record.get("msg") if isinstance(record, dict) and record.get("level") == "error" else None
        return _printable(str(message)) if message else None
    if (found := _LOGRUS_ERROR.search(line)) is None:
        return None
    try:
        return _printable(str(json.loads(found.group(1))))
    except ValueError:
        return _printable(found.group(1))


def _printable(text: str) -> str:
    return "".join(char if char.isprintable() else f"\\x{ord(char):02x}" for char in text[:MAX_CAUSE])


class Background:
    """A program running beside us, its output kept in private files until it ends."""

    def __init__(self, argv: Sequence[str], *, own_group: bool = False) -> None:
        """`own_group`: a Ctrl-C at the terminal reaches us only, and we wind the program down in order."""
        # Deferred: tempfile (and shutil, bz2, random under it) costs ~7 ms, and the shim's verbs,
        # `delete` on every container's end among them, load this module but never run this class.
        import tempfile

        self.name = os.path.basename(argv[0])
        self.argv = list(argv)
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by wait(), after the program ends
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by wait(), after the program ends
        try:
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err,
                                          process_group=0 if own_group else None)
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
