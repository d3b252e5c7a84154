"""Every call of the delegate runtime (runc, crun, ...) from an owned verb, through the process seam.

Owned verbs run it as a child with the caller's stdio and fds, forwarding signals, and pass
its status on. Pass-through (exec) is shim/resolve.py's, which loads none of this.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import DelegateError
from ..host import process
from ..host.procfs import descendants, live_start_time, start_time
from .argv import RuntimeArgs, VerbArgs, parse_verb_args
from .log import hold_stderr

if TYPE_CHECKING:
    from ..oci.state import ContainerState

REAP_WAIT_S = 10.0  # a SIGKILLed child of the delegate's (criu) waited for this long to be gone
# Signals an engine may send to the runtime; runc forwards them to the container.
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH")
TERMINATING_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class DelegateRun:
    """The delegate running as the shim's child, stdio and fds inherited.

    Signals the shim receives go to the child; terminating ones are remembered in
    `interrupted_by` so the caller can roll back once the child has ended. With `hold_stderr`,
    what the child writes to stderr is held (shim/log.py) and written after the shim's own
    error line, if it has one: containerd's shim passes on only the first line of a failed
    checkpoint's stderr, and runc's is "criu failed: type NOTIFY errno 0".

    With `reap`, the processes the delegate started (runc's `criu swrk`, in runc's process group but
    not killed with it) are noted when a terminating signal arrives or the deadline passes, and
    SIGKILLed once the delegate ended: runc dies of SIGTERM and leaves a criu waiting for a page
    server for ever.
    """

    def __init__(self, delegate: str, argv: Sequence[str], hold_stderr: bool = False, reap: bool = False) -> None:
        self.delegate = delegate
        self.timed_out = False
        self._reap = reap
        self._started_by_it: dict[int, int] = {}  # pid -> start time: what the delegate started, once noted
        self.argv = list(argv)
        self.interrupted_by: int | None = None
        self.returncode: int | None = None
        self._child: process.Child | None = None
        self._hold_stderr = hold_stderr
        self._reader: threading.Thread | None = None
        self._ended = threading.Event()

    def _forward(self, signum: int, _frame: object) -> None:
        if signal.Signals(signum).name in TERMINATING_SIGNALS and self.interrupted_by is None:
            self.interrupted_by = signum
        if signal.Signals(signum).name in TERMINATING_SIGNALS:
            self._note_started_by_it()
        if self._child is not None and self._child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._child.send_signal(signum)

    def start(self) -> None:
        """Start the child; from now until finish() our signals go to it."""
        self._previous = {sig: signal.signal(sig, self._forward)
                          for sig in (getattr(signal, name) for name in FORWARDED_SIGNALS)}
        try:
            self._child = process.spawn([self.delegate, *self.argv], pipe_stderr=self._hold_stderr)
        except process.CommandError as error:
            self._restore_handlers()
            raise DelegateError(f"delegate runtime: {error}") from None
        if self._child.stderr is not None:  # drained as it comes, so the child never blocks on a full pipe
            self._reader = threading.Thread(target=hold_stderr, args=(self._child.stderr, self._ended),
                                            daemon=True)
            self._reader.start()

    @property
    def pid(self) -> int | None:
        """The child's PID once started."""
        return self._child.pid if self._child is not None else None

    def poll(self) -> int | None:
        """The exit status if the child has ended, else None."""
        assert self._child is not None
        code = self._child.poll()
        return None if code is None else exit_status(code)

    def _note_started_by_it(self) -> None:
        """The delegate's descendants as they are now (it may die before it could end them)."""
        if not self._reap or self._child is None or self._child.returncode is not None:
            return
        for pid in descendants(self._child.pid)[1:]:
            if (started := start_time(pid)) is not None:
                self._started_by_it.setdefault(pid, started)

    def _reap_started_by_it(self) -> None:
        """SIGKILL what the delegate started and left behind (still those processes), and wait until gone."""
        left = dict(self._started_by_it)
        for pid, started in left.items():
            if start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + REAP_WAIT_S
        while any(live_start_time(pid) == started for pid, started in left.items()) and time.monotonic() < deadline:
            time.sleep(0.02)  # not our children (runc's, reparented): the subreaper or init reaps them

    def finish(self, timeout_s: float | None = None) -> int:
        """Wait for the child; its exit status (128+N if killed by signal N). Past `timeout_s` the child and
        what it started are killed (SIGKILL) and `timed_out` says so."""
        assert self._child is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while True:
                try:
                    left_s = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                    try:
                        code = process.wait_within(self._child, left_s)
                    except TimeoutError:
                        self.timed_out, self._reap = True, True
                        self._note_started_by_it()
                        with contextlib.suppress(ProcessLookupError):
                            self._child.kill()
                        code = self._child.wait()
                    self.returncode = exit_status(code)
                    if self.interrupted_by is not None or self.timed_out:
                        self._reap_started_by_it()
                    self._ended.set()  # the reader stops at what is in the pipe, not at a helper's EOF
                    if self._reader is not None:
                        self._reader.join()
                    return self.returncode
                except InterruptedError:
                    continue
        finally:
            self._restore_handlers()

    def _restore_handlers(self) -> None:
        for sig, handler in getattr(self, "_previous", {}).items():
            signal.signal(sig, handler)
        self._previous = {}

    def wait(self) -> int:
        """Run to the end; the child's exit status."""
        self.start()
        return self.finish()


def run_delegate(delegate: str, argv: Sequence[str]) -> int:
    """Run the delegate as a child and wait; its exit status."""
    return DelegateRun(delegate, argv).wait()


def _query(delegate: str, argv: Sequence[str]) -> str:
    """A short read-only delegate call (state, ps, --version); its stdout."""
    try:
        return process.run([delegate, *argv], timeout_s=60).stdout
    except process.CommandError as error:
        raise DelegateError(str(error), error.returncode) from None


def delegate_version(delegate: str) -> str:
    return _query(delegate, ["--version"])


def verb_has_flag(delegate: str, verb: str, flag: str) -> bool:
    """Whether the delegate's `verb --help` lists `--flag` (runc 1.3 has checkpoint --link-remap,
    runc 1.1 and crun have not)."""
    try:
        return f"--{flag}" in _query(delegate, [verb, "--help"])
    except DelegateError:
        return False


def container_exists(delegate: str, global_argv: Sequence[str], container_id: str) -> bool:
    """Whether the delegate knows the container (`RT state ID` succeeds); its output is not read."""
    try:
        _query(delegate, [*global_argv, "state", container_id])
    except DelegateError:
        return False
    return True


def container_state(delegate: str, global_argv: Sequence[str], container_id: str) -> ContainerState:
    """`RT state ID`: status, pid, bundle, annotations."""
    # Deferred: pydantic costs ~100 ms, and `delete` (the end of every container) loads this
    # module but only asks whether the container exists (container_exists).
    from pydantic import ValidationError

    from ..oci.problems import first_problem
    from ..oci.state import ContainerState

    output = _query(delegate, [*global_argv, "state", container_id])
    try:
        return ContainerState.model_validate_json(output)
    except ValidationError as error:
        problem = first_problem(error, "output")
        raise DelegateError(f"{os.path.basename(delegate)} state {container_id}: {problem}") from None


def container_pids(delegate: str, global_argv: Sequence[str], container_id: str) -> list[int]:
    """Host PIDs of every process in the container (`RT ps --format json ID`)."""
    return PidsQuery(delegate, global_argv, container_id).pids()


class PidsQuery:
    """container_pids() started now and read later, so that it runs beside another query (`state`)."""

    def __init__(self, delegate: str, global_argv: Sequence[str], container_id: str) -> None:
        self.delegate, self.container_id = delegate, container_id
        self._running: process.Running | None = None
        try:
            self._running = process.Running([delegate, *global_argv, "ps", "--format", "json", container_id],
                                            timeout_s=60)
        except process.CommandError as error:
            self._failed: DelegateError | None = DelegateError(str(error), error.returncode)
        else:
            self._failed = None

    def _output(self) -> str:
        running, self._running = self._running, None
        if running is None:
            raise self._failed or DelegateError(f"{os.path.basename(self.delegate)} ps {self.container_id}: read twice")
        try:
            return running.finish().stdout
        except process.CommandError as error:
            raise DelegateError(str(error), error.returncode) from None

    def pids(self) -> list[int]:
        output = self._output()
        try:
            return [int(pid) for pid in json.loads(output) or []]
        except (ValueError, TypeError):
            raise DelegateError(
                f"{os.path.basename(self.delegate)} ps {self.container_id}: output is not a JSON list of PIDs"
            ) from None

    def close(self) -> None:
        """Its end waited for, unread (the verb stopped before it needed the PIDs)."""
        if self._running is not None:
            with contextlib.suppress(DelegateError):
                self._output()


def kill_container(delegate: str, global_argv: Sequence[str], container_id: str) -> None:
    """SIGKILL a container and delete it: for a restore that cannot be completed."""
    process.run([delegate, *global_argv, "kill", container_id, "KILL"], check=False)
    process.run([delegate, *global_argv, "delete", "--force", container_id], check=False)


def owned_call(args: RuntimeArgs, value_flags: frozenset[str]) -> tuple[VerbArgs, str] | None:
    """An owned verb's arguments and container ID when the shim acts on the call; None when the
    delegate's own answer is all there is (a help request, no container named). A missing
    --work-path is made first."""
    verb = parse_verb_args(args.command_args, value_flags)
    container_id = verb.container_id
    if verb.has("help") or verb.has("h") or container_id is None:
        return None
    ensure_work_path(verb.value("work-path"))
    return verb, container_id


def ensure_work_path(work_path: str | None) -> None:
    """Create a missing --work-path as runc does; crun does not, and containerd relies on it."""
    if not work_path:
        return
    try:
        os.mkdir(work_path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        pass  # the delegate reports the path it cannot use
