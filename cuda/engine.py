"""Moving a container's CUDA processes together: lock, checkpoint, restore, unlock.

One worker thread per process (the driver API is safe to call concurrently for
different PIDs and scales ~3.3x for four). Every process the session touched is
remembered, so `rollback` can put each back to running from whatever state the
driver reports, and no path leaves a process locked or checkpointed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from gpuckpt.cuda.driver import CudaDriver, GpuPair, ProcessState
from gpuckpt.errors import GpuCheckpointError


def run_parallel(action: Callable[[int], None], pids: Sequence[int]) -> dict[int, BaseException]:
    """Run `action(pid)` for every pid at once; the failures by pid.

    Even if the calling thread is interrupted (a signal handler raising), every
    call already started is waited for before the interruption propagates: the
    caller's journal must know each process's outcome before it rolls back.
    """
    failures: dict[int, BaseException] = {}
    if not pids:
        return failures
    # On interruption, leaving the `with` still waits for every call in flight.
    with ThreadPoolExecutor(max_workers=len(pids), thread_name_prefix="gpuckpt-cuda") as pool:
        futures: dict[Future, int] = {pool.submit(action, pid): pid for pid in pids}
        wait(futures)
    for future, pid in futures.items():
        error = future.exception()
        if error is not None:
            failures[pid] = error
    return failures


def describe_failures(step: str, failures: dict[int, BaseException]) -> str:
    parts = [f"pid {pid}: {error}" for pid, error in sorted(failures.items())]
    return f"{step} failed for {len(failures)} CUDA process(es): " + "; ".join(parts)


class CudaSession:
    """The CUDA processes of one container, moved as one."""

    def __init__(self, driver: CudaDriver, pids: Iterable[int]) -> None:
        self.driver = driver
        self.pids = sorted(set(pids))
        self.touched: set[int] = set()  # every pid a lock was tried on: rollback candidates
        self.timings: dict[str, float] = {}

    def _timed(self, name: str, action: Callable[[int], None], pids: Sequence[int], step: str) -> None:
        started = time.monotonic()
        failures = run_parallel(action, pids)
        self.timings[name] = time.monotonic() - started
        if failures:
            raise GpuCheckpointError(describe_failures(step, failures))

    def require_running(self) -> None:
        """Refuse processes someone else has locked or checkpointed (we must not resume those)."""
        for pid in self.pids:
            state = self.driver.state(pid)
            if state != ProcessState.RUNNING:
                raise GpuCheckpointError(
                    f"CUDA process {pid} is {state.name.lower()}, not running: "
                    "is it suspended (gpuckpt resume) or being checkpointed by another tool?")

    def lock(self, timeout_ms: int) -> None:
        self.touched.update(self.pids)
        self._timed("lock_s", lambda pid: self.driver.lock(pid, timeout_ms), self.pids, "lock")

    def checkpoint(self) -> None:
        """Move each process's device memory into its host memory; the GPU is released."""
        self._timed("device_checkpoint_s", self.driver.checkpoint, self.pids, "device checkpoint")

    def restore(self, gpu_pairs: Sequence[GpuPair] = ()) -> None:
        """Put checkpointed processes back on the GPU (remapped by `gpu_pairs`); they stay locked."""
        self.driver.init()
        self.touched.update(self.pids)
        self._timed("device_restore_s", lambda pid: self.driver.restore(pid, gpu_pairs), self.pids,
                    "device restore")

    def unlock(self) -> None:
        self._timed("unlock_s", self.driver.unlock, self.pids, "unlock")

    def _resume_one(self, pid: int) -> None:
        state = self.driver.state(pid)
        if state == ProcessState.CHECKPOINTED:
            self.driver.init()
            self.driver.restore(pid, ())
            state = ProcessState.LOCKED
        if state == ProcessState.LOCKED:
            self.driver.unlock(pid)

    def rollback(self) -> list[str]:
        """Bring every touched process back to running; what could not be, one line each."""
        failures = run_parallel(self._resume_one, sorted(self.touched))
        # A process that no longer exists needs no resuming.
        return [f"pid {pid}: {error}" for pid, error in sorted(failures.items())
                if os.path.exists(f"/proc/{pid}")]
