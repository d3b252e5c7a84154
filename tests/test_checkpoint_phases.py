"""Crash-consistent phases of checkpoint and restore (#16 item 0), through the fake driver.

Each test makes one thing go wrong at one point between the shim's phases (a signal, a
failed write, a cgroup that goes away, another tool's lock) and checks what the shim
leaves behind: every CUDA process running, or a complete image, never locked for ever.
"""

from __future__ import annotations

import pytest
import test_gpu_verbs
from fake_driver import FakeDriver

from gpuckpt.cuda.driver import ProcessState
from gpuckpt.errors import DelegateError

make_node = test_gpu_verbs.make_node  # the fake node, its runtime and its driver (fixtures)
suspendable = test_gpu_verbs.suspendable


# -- rollback undoes what the shim did, nothing else ------------------------------------------


class AnotherToolDriver(FakeDriver):
    """Another tool suspends `victim` between the shim's "running?" check and its lock."""

    def __init__(self, pids, victim: int, **kwargs) -> None:
        super().__init__(pids, **kwargs)
        self.victim = victim

    def lock(self, pid: int, timeout_ms: int) -> None:
        if pid == self.victim:
            with self._lock:
                self.states[pid] = ProcessState.CHECKPOINTED
        super().lock(pid, timeout_ms)


def test_rollback_leaves_alone_a_process_whose_lock_failed(make_node) -> None:
    node = make_node(3)
    victim = node.pids[1]
    node.driver = AnotherToolDriver(node.pids, victim)
    with pytest.raises(DelegateError, match="CUDA_ERROR_ILLEGAL_STATE"):
        node.checkpoint()
    assert node.driver.states[victim] == ProcessState.CHECKPOINTED  # the other tool's, as it left it
    assert victim not in node.driver.calls_of("restore") + node.driver.calls_of("unlock")
    assert all(node.driver.states[pid] == ProcessState.RUNNING for pid in node.pids if pid != victim)
