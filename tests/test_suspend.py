"""Suspend/resume through the fake driver: parallel, rolled back on failure, never half-done."""

from __future__ import annotations

import subprocess

import pytest
from fake_driver import FakeDriver

from gpuckpt.cuda.devices import GpuInfo
from gpuckpt.cuda.driver import GpuPair, ProcessState
from gpuckpt.cuda.node import NodeGpus
from gpuckpt.cuda.suspend import resume, suspend
from gpuckpt.errors import GpuCheckpointError
from gpuckpt.node.suspension import read_suspension, remove_suspension, write_suspension

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"


@pytest.fixture
def workers(node):
    """Real processes standing for a container's CUDA processes, 4 GiB each on GPU 0."""
    sleeps = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    pids = [p.pid for p in sleeps]
    driver = FakeDriver(pids, visible_gpus={pid: [UUID0, UUID1] for pid in pids})
    free = {"bytes": 79 << 30}
    gpus = NodeGpus(
        load_driver=lambda: driver,
        descendants=lambda init: pids,
        find_cuda_pids=lambda candidates: [p for p in candidates if p in pids],
        compute_processes=lambda: {pid: {UUID0: 4 << 30} for pid in pids},
        list_gpus=lambda: [GpuInfo(0, UUID0, "H100", 80 << 30, free["bytes"], 0),
                           GpuInfo(1, UUID1, "H100", 80 << 30, 80 << 30, 1)])
    yield driver, pids, free, gpus
    for sleep in sleeps:
        sleep.kill()
        sleep.wait()


def test_suspend_then_resume(workers) -> None:
    driver, pids, _, gpus = workers
    record = suspend(driver, "ctr", "podman", pids[0], 1000, gpus=gpus)
    assert all(driver.states[pid] == ProcessState.CHECKPOINTED for pid in pids)
    assert sum(p.device_bytes for p in record.processes) == 12 << 30
    write_suspension(record)
    assert read_suspension("ctr") == record  # survives the command
    resume(driver, read_suspension("ctr"), gpus=gpus)
    assert all(driver.states[pid] == ProcessState.RUNNING for pid in pids)
    remove_suspension("ctr")
    assert read_suspension("ctr") is None


def test_failed_suspend_leaves_every_process_running(workers) -> None:
    driver, pids, _, gpus = workers
    driver.fail_on[("checkpoint", pids[2])] = "CUDA_ERROR_OUT_OF_MEMORY"
    with pytest.raises(GpuCheckpointError, match="the container keeps running"):
        suspend(driver, "ctr", "podman", pids[0], 1000, gpus=gpus)
    assert all(driver.states[pid] == ProcessState.RUNNING for pid in pids)


def test_resume_refused_without_the_memory_stays_suspended(workers) -> None:
    driver, pids, free, gpus = workers
    record = suspend(driver, "ctr", "podman", pids[0], 1000, gpus=gpus)
    free["bytes"] = 8 << 30  # another job took the GPU meanwhile
    with pytest.raises(GpuCheckpointError, match="refused, it stays suspended: .* needs 12288 MiB"):
        resume(driver, record, gpus=gpus)
    assert all(driver.states[pid] == ProcessState.CHECKPOINTED for pid in pids)
    assert driver.calls_of("restore") == []


def test_failed_resume_goes_back_to_cleanly_suspended(workers) -> None:
    driver, pids, _, gpus = workers
    record = suspend(driver, "ctr", "podman", pids[0], 1000, gpus=gpus)
    driver.fail_on[("restore", pids[1])] = "CUDA_ERROR_UNKNOWN"
    with pytest.raises(GpuCheckpointError, match="it stays suspended"):
        resume(driver, record, gpus=gpus)
    assert all(driver.states[pid] == ProcessState.CHECKPOINTED for pid in pids)


def test_resume_onto_the_other_gpu(workers) -> None:
    driver, pids, _, gpus = workers
    record = suspend(driver, "ctr", "podman", pids[0], 1000, gpus=gpus)
    resume(driver, record, [GpuPair(UUID0, UUID1), GpuPair(UUID1, UUID0)], gpus=gpus)
    assert all(driver.visible_gpus[pid] == [UUID1, UUID0] for pid in pids)
    assert all(driver.states[pid] == ProcessState.RUNNING for pid in pids)
