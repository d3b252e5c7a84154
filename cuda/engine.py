"""Moving a container's CUDA processes together: lock, checkpoint, restore, unlock.

One worker thread per process (the driver API is safe to call concurrently for
different PIDs and scales ~3.3x for four). The session keeps a journal of what its
own calls did to each process (a call that failed did nothing, so a process another
tool locked or suspended is never "resumed"), and `rollback` puts back to running
each process the journal names, from whatever state the driver reports.

A watchdog guards every driver call. The driver's lock ignores its timeout for a
stopped process and waits until it is continued (r580, H100), and a process in the
container can stop a CUDA process (SIGSTOP) between the shim's check and the lock.
Past the lock's timeout plus a margin (for the other calls, which have no timeout:
past the margin), a target found stopped is continued with SIGCONT: that is what
ends the driver's wait, after which the call completes and the session rolls back
as for any failure, names the stopped PID, and stops it again as it was. A target
that stays stopped (a tracer's stop, which SIGCONT does not end) or a call that
never returns is abandoned after a bound: its thread is a daemon, the shim exits,
and the error says the process may stay locked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import GpuCheckpointError, GpuckptError
from ..host.procfs import is_stopped
from .driver import CudaDriver, GpuPair, ProcessState

# Past the lock's own timeout, a lock still in flight is waiting on something the timeout
# does not cover; the other calls get the same margin before a stopped target is continued.
WATCHDOG_MARGIN_S = 2.0
# A target still stopped this long after the first SIGCONT, or a lock this long past its
# margin, is given up on.
GIVE_UP_S = 10.0
POLL_S = 0.05


class StoppedDuringCall(GpuCheckpointError):
    """The process was stopped while a driver call waited on it; it was continued so the call could return."""

    def __init__(self, pid: int, step: str) -> None:
        super().__init__(f"pid {pid} was stopped (SIGSTOP) during the {step}; continued (SIGCONT) so the driver "
                         "call could return")


class CallAbandoned(GpuCheckpointError):
    """A driver call did not return within the watchdog's bound; its thread was left behind."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"pid {pid}: the driver call did not return (the process stays stopped, held by a "
                         "tracer?); it may stay locked")


@dataclass
class Watchdog:
    """What to do about calls still in flight: from `act_after_s` on, continue stopped targets;
    give up on a call once its target stayed stopped for GIVE_UP_S, or at `give_up_after_s`."""

    act_after_s: float
    give_up_after_s: float | None = None
    continued: set[int] = field(default_factory=set)  # every pid sent SIGCONT
    stopped_since: dict[int, float] = field(default_factory=dict)

    def check(self, pending: Sequence[int], elapsed_s: float, now: float) -> list[int]:
        """Act on the pids whose calls are still in flight; the pids to abandon."""
        if elapsed_s < self.act_after_s:
            return []
        abandon = []
        for pid in pending:
            if is_stopped(pid):
                since = self.stopped_since.setdefault(pid, now)
                self.continued.add(pid)
                _signal(pid, signal.SIGCONT)
                if now - since >= GIVE_UP_S:
                    abandon.append(pid)
            else:
                self.stopped_since.pop(pid, None)
        if self.give_up_after_s is not None and elapsed_s >= self.give_up_after_s:
            return list(pending)
        return abandon


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone already: nothing left to stop or continue
        os.kill(pid, signum)


class _Call(threading.Thread):
    """One driver call for one pid, on a daemon thread: a call the driver never returns must
    not keep the shim from exiting."""

    def __init__(self, action: Callable[[int], None], pid: int) -> None:
        super().__init__(name=f"gpuckpt-cuda-{pid}", daemon=True)
        self.action, self.pid = action, pid
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.action(self.pid)
        except BaseException as error:  # noqa: BLE001 -- a thread's edge: all of it goes to the caller, per pid
            self.error = error


def _wait(calls: list[_Call], watchdog: Watchdog | None) -> set[int]:
    """Wait for every call (watched); the pids of calls abandoned still in flight."""
    started = time.monotonic()
    abandoned: set[int] = set()
    while pending := [call for call in calls if call.is_alive() and call.pid not in abandoned]:
        pending[0].join(POLL_S)
        if watchdog is not None:
            now = time.monotonic()
            still = [call.pid for call in pending if call.is_alive()]
            abandoned.update(watchdog.check(still, now - started, now))
    return abandoned


def _wait_whatever_arrives(calls: list[_Call], watchdog: Watchdog | None) -> None:
    """Wait for every call even if more interruptions arrive meanwhile (a second SIGINT)."""
    while True:
        try:
            _wait(calls, watchdog)
            return
        except BaseException:  # noqa: BLE001 -- any interruption: the caller re-raises the first
            continue


def run_parallel(action: Callable[[int], None], pids: Sequence[int],
                 watchdog: Watchdog | None = None) -> dict[int, BaseException]:
    """Run `action(pid)` for every pid at once; the failures by pid.

    Even if the calling thread is interrupted (a signal handler raising), every call
    already started is waited for (watched) before the interruption propagates: the
    caller's journal must know each process's outcome before it rolls back. A call the
    watchdog abandons fails with CallAbandoned.
    """
    calls = [_Call(action, pid) for pid in pids]
    try:
        for call in calls:
            call.start()
        abandoned = _wait(calls, watchdog)
    except BaseException:
        _wait_whatever_arrives([call for call in calls if call.ident is not None], watchdog)
        raise
    failures: dict[int, BaseException] = {}
    for call in calls:
        if call.pid in abandoned:
            failures[call.pid] = CallAbandoned(call.pid)
        elif call.error is not None:
            failures[call.pid] = call.error
    return failures


def describe_failures(step: str, failures: dict[int, BaseException]) -> str:
    parts = [str(error) if isinstance(error, (StoppedDuringCall, CallAbandoned)) else f"pid {pid}: {error}"
             for pid, error in sorted(failures.items())]
    return f"{step} failed for {len(failures)} CUDA process(es): " + "; ".join(parts)


def one_line(cause: BaseException) -> str:
    """What went wrong, as part of the user's one line, whatever the exception."""
    if isinstance(cause, OSError) and cause.strerror:
        return f"{cause.filename}: {cause.strerror}" if cause.filename else cause.strerror
    if isinstance(cause, KeyboardInterrupt):
        return "interrupted"
    text = str(cause) if isinstance(cause, GpuckptError) else f"{type(cause).__name__}: {cause}"
    return " ".join(text.split())


def query_states(driver: CudaDriver, pids: Sequence[int]) -> dict[int, ProcessState | BaseException]:
    """Each pid's checkpoint state, or the error its query raised; watched like every driver call
    (GetState also waits while its process is stopped: H100, r580). A process stopped meanwhile
    is continued so the query returns, stopped again, and answered with StoppedDuringCall."""
    found: dict[int, ProcessState | BaseException] = {}

    def read(pid: int) -> None:
        found[pid] = driver.state(pid)
    watchdog = Watchdog(act_after_s=WATCHDOG_MARGIN_S, give_up_after_s=WATCHDOG_MARGIN_S + GIVE_UP_S)
    failures = run_parallel(read, pids, watchdog)
    for pid in sorted(watchdog.continued):
        _signal(pid, signal.SIGSTOP)  # as the container left it; nothing else was touched
        failures.setdefault(pid, StoppedDuringCall(pid, "state query"))
    return {**found, **failures}


class CudaSession:
    """The CUDA processes of one container, moved as one."""

    def __init__(self, driver: CudaDriver, pids: Iterable[int]) -> None:
        self.driver = driver
        self.pids = sorted(set(pids))
        # The journal: the state this session's own last successful call left each process in
        # (a failed call did nothing); rollback candidates. A process back to running leaves it.
        self.done: dict[int, ProcessState] = {}
        self.in_doubt: set[int] = set()  # a state-changing call abandoned in flight: outcome unknown
        self.continued: set[int] = set()  # stopped pids the watchdog continued: stopped again by rollback
        self.abandoned: set[int] = set()  # pids whose driver call never returned: not touched again
        self.timings: dict[str, float] = {}
        self.last_failures: dict[int, BaseException] = {}  # the last step's, by pid: for a caller to judge

    def _timed(self, name: str, action: Callable[[int], None], pids: Sequence[int], step: str, *,
               leads_to: ProcessState, watchdog: Watchdog | None = None) -> None:
        started = time.monotonic()
        watchdog = watchdog or Watchdog(act_after_s=WATCHDOG_MARGIN_S)
        failures = self._watched(action, pids, watchdog, step, leads_to)
        self.timings[name] = time.monotonic() - started
        self.last_failures = failures
        if failures:
            raise GpuCheckpointError(describe_failures(step, failures))

    def _watched(self, action: Callable[[int], None], pids: Sequence[int], watchdog: Watchdog,
                 step: str, leads_to: ProcessState) -> dict[int, BaseException]:
        """Run `action` on each pid (watched); journal the state each call that returned left its
        process in (`leads_to`; running: out of the journal), and each call abandoned in flight."""
        called = [pid for pid in pids if pid not in self.abandoned]
        failures = run_parallel(action, called, watchdog)
        for pid in called:
            if pid in failures:
                if isinstance(failures[pid], CallAbandoned):
                    self.in_doubt.add(pid)
            elif leads_to == ProcessState.RUNNING:
                self.done.pop(pid, None)
            else:
                self.done[pid] = leads_to
        self.continued |= watchdog.continued
        self.abandoned |= {pid for pid, error in failures.items() if isinstance(error, CallAbandoned)}
        for pid in sorted(watchdog.continued - failures.keys()):
            failures[pid] = StoppedDuringCall(pid, step)
        return failures

    def states(self) -> dict[int, ProcessState]:
        """Each process's checkpoint state (query_states); any failure is one GpuCheckpointError."""
        answers = query_states(self.driver, self.pids)
        failures = {pid: answer for pid, answer in answers.items() if isinstance(answer, BaseException)}
        self.abandoned |= {pid for pid, error in failures.items() if isinstance(error, CallAbandoned)}
        if failures:
            raise GpuCheckpointError(describe_failures("state query", failures))
        return {pid: answer for pid, answer in answers.items() if isinstance(answer, ProcessState)}

    def require_running(self) -> None:
        """Refuse processes someone else has locked or checkpointed (we must not resume those)."""
        for pid, state in sorted(self.states().items()):
            if state != ProcessState.RUNNING:
                raise GpuCheckpointError(
                    f"CUDA process {pid} is {state.name.lower()}, not running: "
                    "is it suspended (gpuckpt resume) or being checkpointed by another tool?")

    def lock(self, timeout_ms: int) -> None:
        after_s = timeout_ms / 1000 + WATCHDOG_MARGIN_S
        self._timed("lock_s", lambda pid: self.driver.lock(pid, timeout_ms), self.pids, "lock",
                    leads_to=ProcessState.LOCKED,
                    watchdog=Watchdog(act_after_s=after_s, give_up_after_s=after_s + GIVE_UP_S))

    def checkpoint(self) -> None:
        """Move each process's device memory into its host memory; the GPU is released."""
        self._timed("device_checkpoint_s", self.driver.checkpoint, self.pids, "device checkpoint",
                    leads_to=ProcessState.CHECKPOINTED)

    def restore(self, gpu_pairs: Sequence[GpuPair] = ()) -> None:
        """Put checkpointed processes back on the GPU (remapped by `gpu_pairs`); they stay locked."""
        self.driver.init()
        self._timed("device_restore_s", lambda pid: self.driver.restore(pid, gpu_pairs), self.pids,
                    "device restore", leads_to=ProcessState.LOCKED)

    def unlock(self) -> None:
        self._timed("unlock_s", self.driver.unlock, self.pids, "unlock", leads_to=ProcessState.RUNNING)

    def _resume_one(self, pid: int) -> None:
        state = self.driver.state(pid)
        if state == ProcessState.CHECKPOINTED:
            self.driver.init()
            self.driver.restore(pid, ())
            state = ProcessState.LOCKED
        if state == ProcessState.LOCKED:
            self.driver.unlock(pid)

    def rollback(self) -> list[str]:
        """Bring every process the journal names back to running, and stop again those the
        watchdog continued; what could not be resumed, one line each."""
        left_behind = sorted(self.in_doubt)
        failures = self._watched(self._resume_one, sorted(self.done.keys() - self.abandoned),
                                 Watchdog(act_after_s=WATCHDOG_MARGIN_S), "rollback", ProcessState.RUNNING)
        for pid in sorted(self.continued - self.abandoned):
            _signal(pid, signal.SIGSTOP)  # as the container left it
        # A process that no longer exists needs no resuming; one the watchdog continued
        # during the rollback itself was resumed all the same.
        lines = [f"pid {pid}: {error}" for pid, error in sorted(failures.items())
                 if os.path.exists(f"/proc/{pid}") and not isinstance(error, StoppedDuringCall)]
        return [f"pid {pid}: its driver call never returned; it may stay locked" for pid in left_behind] + lines


def refuse_stopped(pids: list[int], what: str = "CUDA process(es) {pids}") -> None:
    """The driver's lock ignores its timeout for a stopped process and waits for ever (seen on an
    H100, driver 580), and ptrace would run one: refuse rather than hang the engine."""
    stopped = [pid for pid in pids if is_stopped(pid)]
    if stopped:
        named = what.format(pids=", ".join(map(str, stopped)))
        raise GpuCheckpointError(f"{named} are stopped (SIGSTOP or a tracer): continue them (SIGCONT) and retry")
