"""gpuckptd's warm pool (service/pool.py, issue 34 item 2) over the fake driver: the budget refuses the standby
past it, the records keep the pool across a restart, and a checkpoint that is deleted or no longer verifies
takes its standbys with it.

The standbys here are real processes (sleep) the fake driver holds checkpointed, recorded by the same
`cuda.suspend.standby` the shim writes, and handed out through the same `cuda.suspend.resume` that `gpuckpt
resume` runs; the engine seam (service.pool.StandbyEngine) makes them instead of podman. The archives are real
files signed with this test's node key through trust/."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from fake_driver import FakeDriver

from gpuckpt.cuda.devices import GpuInfo
from gpuckpt.cuda.driver import ProcessState
from gpuckpt.cuda.node import NodeGpus
from gpuckpt.cuda.suspend import STANDBY_ENGINE, recorded_pairs, resume
from gpuckpt.errors import GpuckptError
from gpuckpt.node.config import PoolConfig, ServiceConfig
from gpuckpt.node.suspension import SuspendedProcess, Suspension, read_suspension, remove_suspension, write_suspension
from gpuckpt.service.api import PoolState, Result, parse_request
from gpuckpt.service.operations import Operations
from gpuckpt.service.pool import NAME_PREFIX, Pool
from gpuckpt.service.preemption import PreemptionWatch
from gpuckpt.service.schedule import Schedule
from gpuckpt.service.server import Server
from gpuckpt.trust.keys import require_node_key
from gpuckpt.trust.provenance import signature_path, write_archive_signature

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GIB = 1 << 30


class SleepStandbys:
    """Standbys as sleep processes the fake driver holds checkpointed, each with its suspension record (what the
    shim's standby restore leaves); `held_bytes`: what each reports holding (its device state)."""

    def __init__(self, driver: FakeDriver, held_bytes: int = GIB) -> None:
        self.driver, self.held_bytes = driver, held_bytes
        self.restored: list[str] = []  # the names asked for
        self.removed: list[str] = []  # container IDs
        self.sleeps: dict[int, subprocess.Popen[bytes]] = {}
        self.gpus = NodeGpus(load_driver=lambda: driver, descendants=lambda pid: [pid], list_gpus=lambda: [
            GpuInfo(index=0, uuid=UUID, name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * GIB,
                    memory_free_bytes=79 * GIB, minor=0)])

    def restore(self, checkpoint: str, name: str, store_dir: str) -> str:
        sleep = subprocess.Popen(["sleep", "600"])
        self.sleeps[sleep.pid] = sleep
        self.driver.add_process(sleep.pid, ProcessState.CHECKPOINTED, [UUID])
        container_id = secrets.token_hex(32)
        write_suspension(Suspension(container=container_id, engine=STANDBY_ENGINE, init_pid=sleep.pid,
                                    since="2026-11-28T00:00:00Z", host_bytes=self.held_bytes,
                                    processes=[SuspendedProcess(pid=sleep.pid, gpu_uuids=[UUID], device_bytes=GIB)]))
        self.restored.append(name)
        return container_id

    def host_bytes(self, container_id: str) -> int:
        record = read_suspension(container_id)
        assert record is not None
        return record.host_bytes

    def resume(self, container_id: str) -> None:
        record = read_suspension(container_id)
        assert record is not None
        resume(self.driver, record, recorded_pairs(record), gpus=self.gpus)  # what `gpuckpt resume` runs
        remove_suspension(container_id)

    def remove(self, container_id: str) -> None:
        record = read_suspension(container_id)
        if record is not None:
            os.kill(record.init_pid, signal.SIGKILL)
            self.sleeps[record.init_pid].wait(10)
            remove_suspension(container_id)
        self.removed.append(container_id)

    def exists(self, container_id: str) -> bool:
        record = read_suspension(container_id)
        return record is not None and os.path.exists(f"/proc/{record.init_pid}") and \
            self.sleeps[record.init_pid].poll() is None

    def stop(self) -> None:
        for sleep in list(self.sleeps.values()):
            sleep.kill()
            sleep.wait()


@pytest.fixture
def engine(node):
    made = SleepStandbys(FakeDriver(require_init=True))
    yield made
    made.stop()


def signed_archive(directory: Path, content: bytes = b"a checkpoint archive\n" * 100) -> str:
    archive = directory / "infer.tar.zst"
    archive.write_bytes(content)
    write_archive_signature(str(archive), hashlib.sha256(content).hexdigest(), [], require_node_key())
    return str(archive)


def pool_of(engine: SleepStandbys, standbys: dict[str, int], budget_bytes: int, said: list[str]) -> Pool:
    return Pool(PoolConfig(standbys=standbys, host_budget_bytes=budget_bytes), engine, said.append)


def test_the_budget_refuses_the_standby_past_it(engine, tmp_path) -> None:
    archive = signed_archive(tmp_path)
    said: list[str] = []
    pool = pool_of(engine, {archive: 3}, budget_bytes=2 * GIB + GIB // 2, said=said)
    lines = pool.fill()
    assert len(engine.restored) == 2 and len(pool.records()) == 2  # the third would hold 3 GiB of 2.5
    assert "no standby more" in lines[-1] and "pool.host_budget_bytes" in lines[-1], lines
    assert pool.held_bytes() == 2 * GIB
    assert all(name.startswith(NAME_PREFIX + "infer-") for name in engine.restored)
    # every standby holds its GPU state in host memory: no driver restore or unlock was called
    assert not engine.driver.calls_of("restore") and not engine.driver.calls_of("unlock")


def test_a_standby_that_holds_more_than_its_guess_is_removed_past_the_budget(engine, tmp_path) -> None:
    archive = signed_archive(tmp_path)  # a small file: the first guess is its size
    said: list[str] = []
    pool = pool_of(engine, {archive: 1}, budget_bytes=GIB // 2, said=said)
    lines = pool.fill()
    assert len(engine.restored) == 1 and engine.removed and not pool.records()
    assert "past pool.host_budget_bytes" in lines[-1], lines


def test_take_resumes_the_oldest_and_the_next_is_restored_in_the_background(engine, tmp_path) -> None:
    archive = signed_archive(tmp_path)
    said: list[str] = []
    pool = pool_of(engine, {archive: 2}, budget_bytes=4 * GIB, said=said)
    pool.fill()
    first = pool.records()[0]
    taken, seconds = pool.take(archive)
    assert taken == first and seconds >= 0
    pid = read_suspension(taken.container_id)
    assert pid is None  # resumed: no longer suspended
    assert engine.driver.calls_of("restore") and engine.driver.calls_of("unlock")
    assert pool._filling is not None
    pool._filling.join(30)
    assert len(pool.records()) == 2 and len(engine.restored) == 3
    assert taken.container not in {record.container for record in pool.records()}


def test_take_of_a_checkpoint_with_no_standby_says_why(engine, tmp_path) -> None:
    pool = pool_of(engine, {}, budget_bytes=GIB, said=[])
    with pytest.raises(GpuckptError, match="no standby of other to hand out \\(not in pool.standbys\\)"):
        pool.take("other")


def test_a_restarted_service_keeps_the_pool(engine, tmp_path) -> None:
    archive = signed_archive(tmp_path)
    first = pool_of(engine, {archive: 2}, budget_bytes=4 * GIB, said=[])
    first.fill()
    before = first.records()
    again = pool_of(engine, {archive: 2}, budget_bytes=4 * GIB, said=[])  # gpuckptd started again
    assert again.records() == before
    assert again.sweep() == [] and again.fill() == []
    assert len(engine.restored) == 2  # nothing restored twice
    taken, _ = again.take(archive)
    assert taken == before[0]
    assert again._filling is not None
    again._filling.join(30)  # the next one, restored in the background
    assert len(again.records()) == 2


def test_a_standby_whose_container_is_gone_is_forgotten(engine, tmp_path) -> None:
    archive = signed_archive(tmp_path)
    pool = pool_of(engine, {archive: 1}, budget_bytes=4 * GIB, said=[])
    pool.fill()
    record = pool.records()[0]
    engine.remove(record.container_id)  # `podman rm -f` outside the pool
    assert "forgotten" in pool.sweep()[0] and not pool.records()


@pytest.mark.hostile("a pool checkpoint's archive signature replaced by bytes that do not verify")
def test_a_standby_whose_signature_no_longer_verifies_is_removed(engine, tmp_path) -> None:
    archive = signed_archive(tmp_path)
    said: list[str] = []
    pool = pool_of(engine, {archive: 2}, budget_bytes=4 * GIB, said=said)
    pool.fill()
    held = [record.container_id for record in pool.records()]
    Path(signature_path(archive)).write_bytes(b'{"key_id": "x", "payload": "e30=", "signature": "AAAA"}')
    lines = pool.sweep()
    assert sorted(engine.removed) == sorted(held) and not pool.records()
    assert all("removed" in line for line in lines) and len(lines) == 2
    assert not any(engine.sleeps[pid].poll() is None for pid in engine.sleeps)  # their processes ended
    refused = pool.fill()  # and none is restored from it while it does not verify
    assert len(engine.restored) == 2 and refused and refused[0].startswith(f"pool: no standby of {archive}")


def test_a_standby_whose_archive_changed_is_removed(engine, tmp_path) -> None:
    archive = signed_archive(tmp_path)
    pool = pool_of(engine, {archive: 1}, budget_bytes=4 * GIB, said=[])
    pool.fill()
    Path(archive).write_bytes(b"another checkpoint\n" * 200)  # same path and signature, other bytes
    assert "changed since the standby was restored" in pool.sweep()[0] and not pool.records()


def test_a_standby_whose_checkpoint_was_deleted_is_removed(engine, tmp_path) -> None:
    archive = signed_archive(tmp_path)
    pool = pool_of(engine, {archive: 1}, budget_bytes=4 * GIB, said=[])
    pool.fill()
    os.unlink(archive)
    assert "no such archive" in pool.sweep()[0] and not pool.records() and engine.removed


def test_a_stored_checkpoint_missing_from_the_store_restores_nothing(engine, tmp_path) -> None:
    pool = Pool(PoolConfig(standbys={"infer-v1": 1}, host_budget_bytes=4 * GIB, store_dir=str(tmp_path / "store")),
                engine, lambda line: None)
    lines = pool.fill()
    assert not engine.restored and "stored checkpoint infer-v1: not in" in lines[0], lines


def test_a_pool_entry_that_is_neither_a_name_nor_an_absolute_path_is_refused() -> None:
    with pytest.raises(ValueError, match="give a stored checkpoint's name"):
        PoolConfig(standbys={"../escape": 1})


def test_the_local_api_shows_the_pool_and_hands_a_standby_out(engine, tmp_path) -> None:
    archive = signed_archive(tmp_path)
    pool = pool_of(engine, {archive: 1}, budget_bytes=4 * GIB, said=[])
    pool.fill()
    config = ServiceConfig()
    operations = Operations(config)
    server = Server(str(tmp_path / "api.sock"), operations, PreemptionWatch(config, operations, threading.Event()),
                    Schedule(config, operations), drains_on_stop=False, pool=pool)
    events: list = []
    try:
        server._answer(parse_request(b'{"op": "pool-status"}'), events.append)
        server._answer(parse_request(json.dumps({"op": "pool-take", "checkpoint": archive}).encode()),
                         events.append)
    finally:
        server.close()
    state, taken = events
    assert isinstance(state, PoolState) and [entry.checkpoint for entry in state.standbys] == [archive]
    assert state.held_bytes == GIB and state.budget_bytes == 4 * GIB and state.wanted == {archive: 1}
    assert isinstance(taken, Result) and taken.ok and taken.done == [state.standbys[0].container]
    assert pool._filling is not None
    pool._filling.join(30)
