"""Crash-consistent phases of checkpoint and restore (#16 item 0), through the fake driver.

Each test makes one thing go wrong at one point between the shim's phases (a signal, a
failed write, a cgroup that goes away, another tool's lock) and checks what the shim
leaves behind: every CUDA process running, or a complete image, never locked for ever.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import test_gpu_verbs
from fake_driver import FakeDriver
from test_gpu_verbs import checkpointed_node, restore_args, run_verb

from gpuckpt.cuda.driver import ProcessState
from gpuckpt.cuda.node import NodeGpus
from gpuckpt.errors import DelegateError, GpuCheckpointError, ImageError
from gpuckpt.oci.manifest import parse_manifest, read_manifest
from gpuckpt.shim import freezer, restore

make_node = test_gpu_verbs.make_node  # the fake node, its runtime and its driver (fixtures)
suspendable = test_gpu_verbs.suspendable


def join_driver_calls() -> None:
    """Wait for driver calls the shim may have left in flight, so the states read are final."""
    for thread in threading.enumerate():
        if thread.name.startswith("gpuckpt-cuda-"):
            thread.join(5)


# -- the manifest: written before the dump, completed after it ------------------------------


def test_a_manifest_write_failing_after_the_dump_leaves_an_image_restore_refuses(make_node) -> None:
    node = make_node(2)
    node.set_runtime(checkpoint_fills_disk_bytes=256)  # the dump fills the disk: the manifest no longer fits
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        with pytest.raises(GpuCheckpointError) as raised:
            node.checkpoint()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
    message = str(raised.value)
    assert "\n" not in message and "the dump completed but its manifest could not be completed" in message
    assert "checkpoint" in node.verbs_called()
    node.set_runtime()
    before_restore = len(node.calls())
    with pytest.raises(ImageError) as refused:
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert "\n" not in str(refused.value)
    assert f"{node.images}/gpuckpt-manifest.json: the dump of ctr never completed" in str(refused.value)
    assert "restore" not in node.verbs_called()[before_restore:]


def test_the_manifest_is_marked_complete_after_the_dump(make_node) -> None:
    node = make_node(2)
    assert node.checkpoint() == 0
    assert read_manifest(str(node.images)).dump_completed


def test_a_manifest_of_an_older_gpuckpt_reads_as_complete() -> None:
    """Before this field, the manifest was written only after a successful dump."""
    older = b'{"schema_version": 1, "created": "2026-11-01T00:00:00Z", "container_id": "ctr"}'
    assert parse_manifest(older, "older.json").dump_completed


# -- rollback on any exception ------------------------------------------------------------


class CgroupGoneDriver(FakeDriver):
    """The container's freezer cgroup goes away while its processes are checkpointed: freezing it
    again after the GPU steps fails with an OSError."""

    def __init__(self, pids, cgroup: Path, **kwargs) -> None:
        super().__init__(pids, **kwargs)
        self.cgroup = cgroup

    def checkpoint(self, pid: int) -> None:
        super().checkpoint(pid)
        control = self.cgroup / "freezer.state"
        with self._lock:
            if control.is_file():
                control.unlink()
                control.mkdir()


def test_an_oserror_while_freezing_again_rolls_every_process_back(make_node, monkeypatch, tmp_path) -> None:
    node = make_node(2)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "freezer.state").write_text("FROZEN\n")  # docker paused the container before its checkpoint
    monkeypatch.setattr(freezer.Freezer, "of_process", classmethod(lambda cls, pid: cls(str(cgroup), v2=False)))
    node.driver = CgroupGoneDriver(node.pids, cgroup)
    with pytest.raises(DelegateError) as raised:
        node.checkpoint()
    message = str(raised.value)
    assert "\n" not in message and "freezer.state" in message
    assert "restored and unlocked and the container keeps running" in message
    assert node.all_running()
    assert "checkpoint" not in node.verbs_called()


# -- signals ------------------------------------------------------------------------------


def test_a_signal_during_a_dump_that_succeeded_completes_the_checkpoint(make_node) -> None:
    node = make_node(2)
    node.set_runtime(checkpoint_signals_caller="SIGTERM")  # runc's dump ends with status 0 all the same
    assert node.checkpoint() == 0
    assert all(node.driver.states[pid] == ProcessState.CHECKPOINTED for pid in node.pids)
    assert node.driver.calls_of("unlock") == []  # the image holds them checkpointed: nothing resumed
    assert read_manifest(str(node.images)).dump_completed
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


class TwoSigtermsDriver(FakeDriver):
    """The engine sends SIGTERM twice while the locks are in flight (a stop timeout, then another)."""

    def lock(self, pid: int, timeout_ms: int) -> None:
        if pid == min(self.states):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGTERM)
        super().lock(pid, timeout_ms)


def test_a_second_sigterm_while_locks_are_in_flight_still_rolls_every_one_back(make_node) -> None:
    node = make_node(3)
    node.driver = TwoSigtermsDriver(node.pids, delay_s={"lock": 0.6})
    arrived: list[int] = []  # the engine's signals outside the shim's handlers: noted, so pytest lives on
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: arrived.append(signum))
    try:
        with pytest.raises(DelegateError) as raised:
            node.checkpoint()
        join_driver_calls()
        assert signal.getsignal(signal.SIGTERM) is not previous  # the caller's handler put back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert node.all_running()  # no lock completed after the rollback
    assert "interrupted by SIGTERM" in str(raised.value)
    assert sorted(node.driver.calls_of("unlock")) == sorted(node.pids)
    assert "checkpoint" not in node.verbs_called()


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


# -- restore ------------------------------------------------------------------------------


def running_here(program: str) -> bool:
    """Whether a child of this process runs `program` (a zombie runs nothing)."""
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as children:
            for child in children.read().split():
                try:
                    with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                        if program.encode() in cmdline.read():
                            return True
                except OSError:
                    pass
    return False


class SigtermInInitDriver(FakeDriver):
    """SIGTERM reaches the shim while cuInit still runs (it takes seconds on a real node), after the
    delegate's restore brought the container back."""

    def __init__(self, pids, restored: Callable[[], bool], **kwargs) -> None:
        super().__init__(pids, **kwargs)
        self.restored = restored

    def init(self) -> None:
        deadline = time.monotonic() + 5
        while not self.restored() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        super().init()


def test_a_sigterm_during_cuinit_stops_the_container_rather_than_leaving_it_locked(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 2)
    states = dict(node.driver.states)
    node.driver = SigtermInInitDriver(node.pids, lambda: "restore" in node.verbs_called()
                                      and not running_here(str(node.runtime)))
    node.driver.states.update(states)

    def dies(signum, frame):  # what the default action does to the shim, as an exception pytest survives
        raise SystemExit(128 + signum)
    previous = signal.signal(signal.SIGTERM, dies)
    try:
        with pytest.raises(GpuCheckpointError) as raised:
            restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "\n" not in str(raised.value)
    assert "interrupted by SIGTERM" in str(raised.value) and "the container was stopped" in str(raised.value)
    assert node.verbs_called()[-2:] == ["kill", "delete"]


# -- suspend on pause -----------------------------------------------------------------------


def test_a_pause_whose_suspension_record_cannot_be_written_leaves_the_container_running(suspendable) -> None:
    """The record is what resume needs: without one written, nothing may stay suspended."""
    node = suspendable
    (node.dir / "state").mkdir()
    (node.dir / "state" / "suspended").write_text("")  # a file where the records' directory belongs
    with pytest.raises(GpuCheckpointError) as raised:
        run_verb(node, "pause")
    assert "\n" not in str(raised.value) and "the container keeps running" in str(raised.value)
    assert f"{node.dir}/state/suspended" in str(raised.value)
    assert node.all_running()
    assert "pause" not in node.verbs_called()
