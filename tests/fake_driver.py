"""A CudaDriver for unit tests: one checkpoint state machine per pid, a call log, injected failures.

It refuses what the real driver refuses (wrong state, missing cuInit, pairs that miss a GPU),
with the same error names and messages, so the code above the seam meets the same behaviour.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence

from gpuckpt.cuda.driver import (
    GPU_REMAP_MIN_VERSION,
    CudaDriver,
    GpuPair,
    ProcessState,
    call_error,
    remap_unsupported,
)

# Which state each transition starts from and leads to.
TRANSITIONS = {
    "lock": (ProcessState.RUNNING, ProcessState.LOCKED),
    "checkpoint": (ProcessState.LOCKED, ProcessState.CHECKPOINTED),
    "restore": (ProcessState.CHECKPOINTED, ProcessState.LOCKED),
    "unlock": (ProcessState.LOCKED, ProcessState.RUNNING),
}


class FakeDriver(CudaDriver):
    """Processes `pids` start RUNNING; everything below is public for tests to set and inspect.

    fail_on: {(method, pid): "CUDA_ERROR_..."} fails that call, state unchanged
             (("lock", pid): "CUDA_ERROR_TIMEOUT" raises LockTimeout).
    delay_s: seconds each lock/checkpoint/restore/unlock takes, or {method: seconds}.
    frozen_pids: a lock on these waits until `thaw(pid)` or its timeout, then LockTimeout; a state
        query waits until `thaw(pid)` (bounded here at 2 s, then CUDA_ERROR_TIMEOUT).
             (The real driver, r580 on an H100, ignored a 1.5 s timeout on a SIGSTOPped
             process and locked it once continued: only a thaw ends that wait.)
    visible_gpus: {pid: [GPU UUIDs]}; a restore with pairs must name every one.
    forked_pids: children forked after CUDA init: r580 answers CUDA_ERROR_NOT_INITIALIZED for them.
    """

    def __init__(self, pids: Iterable[int] = (), *, version: int = 13000,
                 fail_on: Mapping[tuple[str, int], str] | None = None,
                 delay_s: float | Mapping[str, float] = 0.0,
                 frozen_pids: Iterable[int] = (),
                 visible_gpus: Mapping[int, Sequence[str]] | None = None,
                 require_init: bool = True,
                 forked_pids: Iterable[int] = ()) -> None:
        self.version = version
        self.forked_pids: set[int] = set(forked_pids)
        self.states: dict[int, ProcessState] = {pid: ProcessState.RUNNING for pid in pids}
        self.fail_on: dict[tuple[str, int], str] = dict(fail_on or {})
        self.delay_s = delay_s
        self.frozen_pids: set[int] = set(frozen_pids)
        self.visible_gpus: dict[int, list[str]] = {pid: list(gpus) for pid, gpus in (visible_gpus or {}).items()}
        self.require_init = require_init
        self.initialized = False
        self.init_count = 0
        self.calls: list[tuple[str, int]] = []
        self.restored_pairs: dict[int, list[GpuPair]] = {}
        self._lock = threading.Lock()
        self._thawed = threading.Condition(self._lock)

    # -- what tests read and set --------------------------------------------------------

    def add_process(self, pid: int, state: ProcessState = ProcessState.RUNNING,
                    gpus: Sequence[str] = ()) -> None:
        with self._lock:
            self.states[pid] = state
            if gpus:
                self.visible_gpus[pid] = list(gpus)

    def thaw(self, pid: int) -> None:
        """The process leaves the freezer: a lock waiting on it goes ahead."""
        with self._thawed:
            self.frozen_pids.discard(pid)
            self._thawed.notify_all()

    def calls_of(self, method: str) -> list[int]:
        """The pids `method` was called for, in order."""
        with self._lock:
            return [pid for name, pid in self.calls if name == method]

    # -- the driver --------------------------------------------------------------------

    def _enter(self, method: str, pid: int) -> None:
        """Log the call, wait its delay, raise its injected failure."""
        with self._lock:
            self.calls.append((method, pid))
            injected = self.fail_on.get((method, pid))
        delay = self.delay_s.get(method, 0.0) if isinstance(self.delay_s, Mapping) else self.delay_s
        if delay and method in TRANSITIONS:
            time.sleep(delay)
        if injected:
            raise call_error(method, pid, injected)

    def _state_of(self, method: str, pid: int) -> ProcessState:
        """The caller holds self._lock."""
        if pid in self.forked_pids:
            raise call_error(method, pid, "CUDA_ERROR_NOT_INITIALIZED")
        if pid not in self.states:
            # r580 says this for a pid that does not exist (a live non-CUDA one: NOT_INITIALIZED)
            raise call_error(method, pid, "CUDA_ERROR_OPERATING_SYSTEM")
        return self.states[pid]

    def _transition(self, method: str, pid: int) -> None:
        """The caller holds self._lock."""
        source, target = TRANSITIONS[method]
        if self._state_of(method, pid) != source:
            raise call_error(method, pid, "CUDA_ERROR_ILLEGAL_STATE")
        self.states[pid] = target

    def driver_version(self) -> int:
        return self.version

    def init(self) -> None:
        with self._lock:
            self.init_count += 1
            self.initialized = True

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._enter("lock", pid)
        with self._thawed:
            if pid in self.frozen_pids:
                # A frozen process never reaches a lockable point; 0 waits as long as the driver would.
                deadline = None if timeout_ms == 0 else time.monotonic() + timeout_ms / 1000
                while pid in self.frozen_pids:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise call_error("lock", pid, "CUDA_ERROR_TIMEOUT", timeout_ms)
                    self._thawed.wait(remaining)
            self._transition("lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._enter("checkpoint", pid)
        with self._lock:
            self._transition("checkpoint", pid)

    def restore(self, pid: int, gpu_pairs: Sequence[GpuPair] = ()) -> None:
        self._enter("restore", pid)
        with self._lock:
            if self.require_init and not self.initialized:
                raise call_error("restore", pid, "CUDA_ERROR_NOT_INITIALIZED")
            if gpu_pairs and self.version < GPU_REMAP_MIN_VERSION:
                raise remap_unsupported(pid, self.version)
            if self._state_of("restore", pid) != ProcessState.CHECKPOINTED:
                raise call_error("restore", pid, "CUDA_ERROR_ILLEGAL_STATE")
            visible = self.visible_gpus.get(pid, [])
            if gpu_pairs:
                # LAB: a list naming only one of two GPUs failed with invalid value.
                remap = {pair.old_uuid: pair.new_uuid for pair in gpu_pairs}
                if not set(visible) <= set(remap):
                    raise call_error("restore", pid, "CUDA_ERROR_INVALID_VALUE")
                self.visible_gpus[pid] = [remap[uuid] for uuid in visible]
            self.restored_pairs[pid] = list(gpu_pairs)
            self.states[pid] = ProcessState.LOCKED

    def unlock(self, pid: int) -> None:
        self._enter("unlock", pid)
        with self._lock:
            self._transition("unlock", pid)

    def state(self, pid: int) -> ProcessState:
        self._enter("state", pid)
        with self._thawed:
            # r580 on an H100: the state query of a frozen (cgroup freezer) process waits until it is
            # thawed; here a bounded wait, then the error a test sees instead of the driver's hang.
            if pid in self.frozen_pids and not self._thawed.wait_for(lambda: pid not in self.frozen_pids, 2.0):
                raise call_error("state", pid, "CUDA_ERROR_TIMEOUT")
            return self._state_of("state", pid)
