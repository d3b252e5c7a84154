"""The owned verbs' GPU orchestration, driven through the fake driver at the binding seam.

The delegate is tests/fake_runtime.py (a runc stand-in answering state/ps and
returning the configured status); container processes are real `sleep`s, so
/proc reads are real. NVML's inventory is replaced by a fixed one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fake_driver import FakeDriver
from support import write_config

from gpuckpt.cuda import engine, inventory
from gpuckpt.cuda.devices import GpuInfo
from gpuckpt.cuda.driver import ProcessState
from gpuckpt.cuda.node import NodeGpus
from gpuckpt.errors import DelegateError, GpuCheckpointError, ImageError
from gpuckpt.host import procfs
from gpuckpt.node.lock import StateKey
from gpuckpt.node.suspension import read_suspension
from gpuckpt.oci.manifest import GpuRecord, read_manifest
from gpuckpt.shim import checkpoint, freezer, pause, restore
from gpuckpt.shim.argv import parse_runtime_args
from gpuckpt.trust.dump_signature import DUMP_SIGNATURE, sign_dump
from gpuckpt.trust.signature import SignatureError

H100 = "NVIDIA H100 80GB HBM3"
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"


class Node:
    """A fake container: real sleep processes, a bundle with /dev/nvidia0, the fake runtime and driver."""

    def __init__(self, tmp_path: Path, processes: int, monkeypatch: pytest.MonkeyPatch, gpu: bool = True) -> None:
        self.dir = tmp_path
        self.sleeps = [subprocess.Popen(["sleep", "60"]) for _ in range(processes)]
        self.pids = [p.pid for p in self.sleeps]
        self.bundle = tmp_path / "bundle"
        self.bundle.mkdir()
        devices = [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}] if gpu else []
        (self.bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "linux": {"devices": devices},
                                                             "annotations": {}}))
        self.runtime = tmp_path / "runc"
        shutil.copy(Path(__file__).parent / "fake_runtime.py", self.runtime)
        self.images = tmp_path / "images"
        self.set_runtime()
        self.driver = FakeDriver(self.pids, visible_gpus={pid: [UUID0] for pid in self.pids})
        self.gpus: dict = {"load_driver": lambda: self.driver}  # NodeGpus fields this fake node replaces
        self.gpus["find_cuda_pids"] = lambda pids: [pid for pid in pids if pid in self.driver.states]
        self.gpus["describe_container_gpus"] = (lambda spec, pids: inventory.Inventory(
            driver_version="580.159.04", cuda_driver_version=13000,
            gpus=[GpuRecord(index=0, uuid=UUID0, name=H100, memory_total_bytes=80 << 30)],
            node_gpu_uuids=[UUID0, UUID1],
            memory_bytes={pid: 1 << 30 for pid in pids}, process_gpus={pid: [UUID0] for pid in pids}))
        monkeypatch.setattr(freezer.Freezer, "of_process", classmethod(lambda cls, pid: None))

    def set_runtime(self, **overrides) -> None:
        setup = {"state": {"status": "running", "pid": self.pids[0] if self.pids else 1, "bundle": str(self.bundle),
                           "id": "ctr"}, "pids": self.pids, **overrides}
        (self.dir / "runtime.json").write_text(json.dumps(setup))

    def calls(self) -> list[list[str]]:
        log = self.dir / "calls.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def verbs_called(self) -> list[str]:
        return [next(a for a in call if not a.startswith("-") and a not in ("/r",)) for call in self.calls()]

    def checkpoint(self, *extra: str) -> int:
        args = parse_runtime_args(["--root", "/r", "checkpoint", "--image-path", str(self.images), *extra, "ctr"])
        return checkpoint.run(args, str(self.runtime), NodeGpus(**self.gpus))

    def all_running(self) -> bool:
        return all(self.driver.states[pid] == ProcessState.RUNNING for pid in self.pids)

    def stop(self) -> None:
        for sleep in self.sleeps:
            sleep.kill()
            sleep.wait()


@pytest.fixture
def make_node(tmp_path, monkeypatch, node):
    made = []

    def make(processes: int = 2, gpu: bool = True) -> Node:
        made.append(Node(tmp_path, processes, monkeypatch, gpu))
        return made[-1]
    yield make
    for each in made:
        each.stop()


class BarrierDriver(FakeDriver):
    """Each checkpoint waits until every process's checkpoint has started: passes only if run in parallel."""

    def __init__(self, pids, **kwargs) -> None:
        super().__init__(pids, **kwargs)
        self.barrier = threading.Barrier(len(list(pids)), timeout=5)

    def checkpoint(self, pid: int) -> None:
        self.barrier.wait()
        super().checkpoint(pid)


def test_happy_path_checkpoints_all_in_parallel_then_dumps(make_node, monkeypatch) -> None:
    node = make_node(4)
    node.driver = BarrierDriver(node.pids)
    assert node.checkpoint() == 0
    assert all(node.driver.states[pid] == ProcessState.CHECKPOINTED for pid in node.pids)
    assert "checkpoint" in node.verbs_called()
    manifest = read_manifest(str(node.images))
    assert sorted(p.host_pid for p in manifest.processes) == sorted(node.pids)
    assert manifest.gpu_handler == "gpuckpt" and manifest.gpus[0].uuid == UUID0
    assert manifest.timings.downtime_s is None and not manifest.leave_running
    assert oct((node.images / "gpuckpt-manifest.json").stat().st_mode & 0o777) == "0o600"


def test_leave_running_restores_unlocks_and_reports_downtime(make_node) -> None:
    node = make_node(3)
    assert node.checkpoint("--leave-running") == 0
    assert node.all_running()
    assert node.driver.initialized  # cuInit before restore
    manifest = read_manifest(str(node.images))
    assert manifest.leave_running and manifest.timings.downtime_s is not None


def test_a_checkpoint_that_ended_the_container_takes_its_lock_file_with_it(make_node, node) -> None:
    """The engine's delete after it then has nothing of ours to do: the compiled launcher passes it through."""
    made = make_node(1)
    locks = node / "state" / "locks"
    assert made.checkpoint("--leave-running") == 0
    assert (locks / f"{StateKey.of('ctr', '/r').name}.lock").exists()  # the container still runs: its lock file stays
    made.driver.fail_on[("lock", made.pids[0])] = "CUDA_ERROR_TIMEOUT"
    with pytest.raises(DelegateError):
        made.checkpoint()  # rolled back: the container keeps running, and its lock file
    assert (locks / f"{StateKey.of('ctr', '/r').name}.lock").exists()
    del made.driver.fail_on[("lock", made.pids[0])]
    assert made.checkpoint() == 0
    assert not (locks / f"{StateKey.of('ctr', '/r').name}.lock").exists()


def test_lock_timeout_unlocks_the_others_and_never_dumps(make_node) -> None:
    node = make_node(3)
    node.driver.fail_on[("lock", node.pids[1])] = "CUDA_ERROR_TIMEOUT"
    with pytest.raises(DelegateError) as raised:
        node.checkpoint()
    assert "keeps running" in str(raised.value) and "CUDA_ERROR_TIMEOUT" in str(raised.value)
    assert node.all_running()
    assert "checkpoint" not in node.verbs_called()


def test_failure_of_the_nth_process_rolls_back_every_one(make_node) -> None:
    node = make_node(4)
    node.driver.fail_on[("checkpoint", node.pids[2])] = "CUDA_ERROR_OUT_OF_MEMORY"
    with pytest.raises(DelegateError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        node.checkpoint()
    assert node.all_running()
    assert "checkpoint" not in node.verbs_called()


def test_delegate_failure_restores_and_passes_its_status(make_node) -> None:
    node = make_node(2)
    node.set_runtime(checkpoint_status=7)
    with pytest.raises(DelegateError) as raised:
        node.checkpoint()
    assert raised.value.exit_status == 7
    assert node.all_running()
    assert not read_manifest(str(node.images)).dump_completed  # written before the dump, never completed


class SigtermDriver(FakeDriver):
    """Sends the shim SIGTERM as soon as the device checkpoint has started."""

    def checkpoint(self, pid: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        super().checkpoint(pid)


def test_sigterm_midway_rolls_back(make_node, monkeypatch) -> None:
    node = make_node(2)
    node.driver = SigtermDriver(node.pids, delay_s={"checkpoint": 0.3})
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(DelegateError, match="interrupted"):
        node.checkpoint()
    assert node.all_running()
    assert "checkpoint" not in node.verbs_called()
    assert signal.getsignal(signal.SIGTERM) == before  # handlers put back


class FakeFreezer:
    """A frozen cgroup whose thawing lets the fake driver lock its processes."""

    def __init__(self, driver: FakeDriver, pids: list[int], events: list[str]) -> None:
        self.driver, self.pids, self.events, self.frozen = driver, pids, events, True
        driver.frozen_pids.update(pids)

    def is_frozen(self) -> bool:
        return self.frozen

    def set_frozen(self, frozen: bool) -> None:
        self.frozen = frozen
        self.events.append("freeze" if frozen else "thaw")
        for pid in self.pids:
            if frozen:
                self.driver.frozen_pids.add(pid)
            else:
                self.driver.thaw(pid)


def test_frozen_container_is_thawed_for_the_gpu_steps_and_refrozen_before_the_dump(make_node, monkeypatch) -> None:
    node = make_node(2)
    events: list[str] = []
    fake_freezer = FakeFreezer(node.driver, node.pids, events)
    monkeypatch.setattr(freezer.Freezer, "of_process", classmethod(lambda cls, pid: fake_freezer))
    original_run = checkpoint.DelegateRun.start
    monkeypatch.setattr(checkpoint.DelegateRun, "start",
                        lambda self: (events.append(f"dump(frozen={fake_freezer.frozen})"), original_run(self))[1])
    assert node.checkpoint() == 0
    # thawed for the driver's state queries (which wait on a frozen process), then for the lock and checkpoint
    assert events == ["thaw", "freeze", "thaw", "freeze", "dump(frozen=True)"]
    assert all(node.driver.states[pid] == ProcessState.CHECKPOINTED for pid in node.pids)


def test_stopped_process_is_refused_before_any_lock(make_node) -> None:
    node = make_node(2)
    os.kill(node.pids[1], signal.SIGSTOP)
    try:
        with pytest.raises(DelegateError, match=f"{node.pids[1]} are stopped"):
            node.checkpoint()
        assert node.driver.calls_of("lock") == [] and node.all_running()
    finally:
        os.kill(node.pids[1], signal.SIGCONT)


# -- a process stopped between the shim's check and the driver's call (the watchdog) -----


class StopRaceDriver(FakeDriver):
    """A process in the container stops `victim` (SIGSTOP) just as the shim calls `method` on it,
    after the shim's "stopped?" check. Like r580 on an H100, the call then waits for as long as
    the process stays stopped, whatever the lock's timeout, and goes ahead once it is continued.
    With `hold`, something keeps the victim stopped (a tracer's stop: SIGCONT does not end it)."""

    def __init__(self, pids, victim: int, method: str, **kwargs) -> None:
        super().__init__(pids, **kwargs)
        self.victim, self.method = victim, method
        self.hold = threading.Event()

    def _stopped_here(self, method: str, pid: int) -> None:
        if pid == self.victim and method == self.method:
            os.kill(pid, signal.SIGSTOP)
            while not procfs.is_stopped(pid):  # the signal is delivered asynchronously
                threading.Event().wait(0.001)
            deadline = time.monotonic() + 10
            while True:
                if self.hold.is_set():
                    os.kill(pid, signal.SIGSTOP)
                elif not procfs.is_stopped(pid):
                    return
                elif time.monotonic() > deadline:  # without the watchdog the shim would wait here for ever
                    raise AssertionError(f"nothing continued process {pid} within 10 s")
                threading.Event().wait(0.01)

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._stopped_here("lock", pid)
        super().lock(pid, timeout_ms)

    def state(self, pid: int) -> ProcessState:
        self._stopped_here("state", pid)  # GetState waits on a stopped process too (H100)
        if pid == self.victim and self.method == "state":
            self.method = "done"  # once: the rollback's own queries go ahead
        return super().state(pid)

    def checkpoint(self, pid: int) -> None:
        self._stopped_here("checkpoint", pid)
        super().checkpoint(pid)


@pytest.fixture
def quick_watchdog(monkeypatch, node):
    monkeypatch.setattr(engine, "WATCHDOG_MARGIN_S", 0.2)
    monkeypatch.setattr(engine, "GIVE_UP_S", 0.5)
    return lambda made: write_config(made.dir, f'delegate = "{made.runtime}"\n[cuda]\nlock_timeout_ms = 100\n')


def race(node: Node, monkeypatch, method: str) -> StopRaceDriver:
    node.driver = StopRaceDriver(node.pids, node.pids[1], method, visible_gpus={pid: [UUID0] for pid in node.pids})
    return node.driver


@pytest.mark.hostile("a CUDA process stopped (SIGSTOP) by the container between the shim's check and the lock")
@pytest.mark.parametrize("method, step, then", [
    ("state", "state query", ""),  # the shim's first driver call, before any lock: nothing to roll back
    ("lock", "lock", "); its CUDA processes were restored and unlocked and the container keeps running"),
    ("checkpoint", "device checkpoint", "); its CUDA processes were restored and unlocked and the container keeps "
                                        "running"),
])
def test_a_process_stopped_during_the_call_is_continued_rolled_back_and_named(make_node, monkeypatch, quick_watchdog,
                                                                               method, step, then) -> None:
    node = make_node(3)
    quick_watchdog(node)
    race(node, monkeypatch, method)
    victim = node.pids[1]
    started = time.monotonic()
    try:
        with pytest.raises(GpuCheckpointError if method == "state" else DelegateError) as raised:
            node.checkpoint()
        assert time.monotonic() - started < 3  # timeout 0.1 s + margin 0.2 s, not for ever
        message = str(raised.value)
        assert "\n" not in message
        expected = (
            f"pid {victim} was stopped (SIGSTOP) during the {step}; continued (SIGCONT) so the driver call could return"
        )
        assert (expected + then) in message
        assert node.all_running() and "checkpoint" not in node.verbs_called()
        assert method != "state" or node.driver.calls_of("lock") == []
        deadline = time.monotonic() + 2  # SIGSTOP takes effect asynchronously
        while not procfs.is_stopped(victim) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procfs.is_stopped(victim)  # stopped again, as the container had it
        assert not any(procfs.is_stopped(pid) for pid in node.pids if pid != victim)
    finally:
        os.kill(victim, signal.SIGCONT)


@pytest.mark.hostile("a CUDA process held stopped (SIGCONT does not end it) while the driver locks it")
def test_a_call_that_never_returns_is_abandoned_and_the_shim_exits(make_node, monkeypatch, quick_watchdog) -> None:
    node = make_node(2)
    quick_watchdog(node)
    driver = race(node, monkeypatch, "lock")
    driver.hold.set()
    victim = node.pids[1]
    started = time.monotonic()
    try:
        with pytest.raises(GpuCheckpointError) as raised:
            node.checkpoint()
        assert time.monotonic() - started < 5
        message = str(raised.value)
        assert "\n" not in message and f"pid {victim}: the driver call did not return" in message
        assert f"rollback could not resume pid {victim}: its driver call never returned; it may stay locked" in message
        assert driver.states[node.pids[0]] == ProcessState.RUNNING  # the other one was rolled back
        assert driver.calls_of("unlock") == [node.pids[0]]  # the abandoned one was not touched again
        assert "checkpoint" not in node.verbs_called()
    finally:
        driver.hold.clear()
        os.kill(victim, signal.SIGCONT)


def test_unrestorable_process_is_refused_before_any_lock(make_node, monkeypatch) -> None:
    node = make_node(2)
    node.gpus["unrestorable_reason"] = lambda pid, spans_gpus=False: (
        "runs NCCL without NCCL_P2P_DISABLE=1" if pid == node.pids[1] else None
    )
    with pytest.raises(GpuCheckpointError, match="refused: runs NCCL"):
        node.checkpoint()
    assert node.driver.calls_of("lock") == [] and node.all_running()
    assert node.calls()[-1][2:3] != ["checkpoint"] and "checkpoint" not in node.verbs_called()


def test_annotation_allows_an_unrestorable_process(make_node, monkeypatch) -> None:
    node = make_node(1)
    spec = json.loads((node.bundle / "config.json").read_text())
    spec["annotations"] = {"io.gpuckpt.allow-unrestorable": "true"}
    (node.bundle / "config.json").write_text(json.dumps(spec))
    node.gpus["unrestorable_reason"] = lambda pid, spans_gpus=False: "runs NCCL without NCCL_P2P_DISABLE=1"
    assert node.checkpoint() == 0


def test_already_suspended_processes_are_left_alone(make_node) -> None:
    node = make_node(2)
    node.driver.states[node.pids[0]] = ProcessState.CHECKPOINTED
    with pytest.raises(DelegateError, match="checkpointed, not running"):
        node.checkpoint()
    assert node.driver.states[node.pids[0]] == ProcessState.CHECKPOINTED  # not ours to resume
    assert node.driver.states[node.pids[1]] == ProcessState.RUNNING


def test_container_without_gpu_takes_the_plain_path(make_node, monkeypatch) -> None:
    node = make_node(1, gpu=False)

    def no_driver():
        raise AssertionError("the driver must not be loaded for a container without GPU")
    node.gpus["load_driver"] = no_driver
    assert node.checkpoint() == 0
    assert "checkpoint" in node.verbs_called()
    manifest = read_manifest(str(node.images))  # the network policy is recorded for every checkpoint
    assert manifest.gpu_handler == "none" and not manifest.processes and not manifest.gpus


# -- restore --------------------------------------------------------------------------


def checkpointed_node(make_node, monkeypatch, processes: int = 2) -> Node:
    node = make_node(processes)
    assert node.checkpoint() == 0
    node.gpus["container_gpus"] = (lambda spec, pids, gpus=None: [
        GpuInfo(index=0, uuid=UUID0, name=H100, memory_total_bytes=80 << 30, memory_free_bytes=79 << 30, minor=0)])
    node.gpus["driver_version_string"] = lambda: "580.159.04"
    node.gpus["list_gpus"] = (lambda: [
        GpuInfo(index=i, uuid=u, name=H100, memory_total_bytes=80 << 30, memory_free_bytes=79 << 30, minor=i)
        for i, u in enumerate((UUID0, UUID1))])
    node.driver.initialized = False  # a new shim process: cuInit not called yet
    return node


def restore_args(node: Node):
    return parse_runtime_args(["--root", "/r", "restore", "-d", "--bundle", str(node.bundle),
                               "--image-path", str(node.images), "ctr"])


def test_restore_brings_every_process_back_and_unlocks(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 3)
    assert restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus)) == 0
    assert node.all_running()
    assert node.driver.restored_pairs == {pid: [] for pid in node.pids}  # same GPU: no remap


def test_restore_onto_another_gpu_remaps_every_uuid(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    node.gpus["container_gpus"] = (lambda spec, pids, gpus=None: [
        GpuInfo(index=1, uuid=UUID1, name=H100, memory_total_bytes=80 << 30, memory_free_bytes=79 << 30, minor=1)])
    assert restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus)) == 0
    pairs = node.driver.restored_pairs[node.pids[0]]
    # the container sees only its own GPU, so its mapping covers everything the process sees
    assert [(p.old_uuid, p.new_uuid) for p in pairs] == [(UUID0, UUID1)]
    assert node.driver.visible_gpus[node.pids[0]] == [UUID1]


def test_restore_refused_on_another_chip_touches_nothing(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    node.gpus["container_gpus"] = (lambda spec, pids, gpus=None: [
        GpuInfo(index=0, uuid=UUID1, name="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 << 30,
                memory_free_bytes=79 << 30, minor=0)])
    before = len(node.calls())
    with pytest.raises(GpuCheckpointError, match="is a NVIDIA A100-SXM4-80GB, the checkpoint's GPU 0 was a NVIDIA "
                                                 "H100"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert len(node.calls()) == before  # the delegate was never called
    assert node.driver.states[node.pids[0]] == ProcessState.CHECKPOINTED


def signed_as_criu_leaves_it(node: Node) -> None:
    """The fake runtime writes no CRIU images: an inventory.img as CRIU's dump leaves one, and the dump
    signed again over it, as the shim signs after a real dump."""
    (node.images / "inventory.img").write_bytes(b"\x01" * 64)
    assert sign_dump(str(node.images)) is not None


@pytest.mark.hostile("a signed dump whose gpuckpt-manifest.json was changed afterwards into bytes no parser accepts")
def test_restore_checks_the_signature_before_parsing_the_manifest(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    signed_as_criu_leaves_it(node)
    manifest = node.images / "gpuckpt-manifest.json"
    manifest.write_bytes(b"{" * manifest.stat().st_size)
    before = len(node.calls())
    with pytest.raises(SignatureError, match="gpuckpt-manifest.json does not match its sha256 signed at dump"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert len(node.calls()) == before  # the delegate was never called


@pytest.mark.hostile("a signed dump with a CRIU image added after the signature, one the image check would parse")
def test_restore_checks_the_signature_before_parsing_criu_images(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    signed_as_criu_leaves_it(node)
    (node.images / "pstree.img").write_bytes(b"\xff" * 4096)  # the image check reads it first
    before = len(node.calls())
    with pytest.raises(SignatureError, match="pstree.img is not among the files signed at dump"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert len(node.calls()) == before


def test_an_unsigned_unfinished_dump_is_refused_as_unfinished(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    (node.images / "inventory.img").write_bytes(b"\x01" * 64)
    (node.images / DUMP_SIGNATURE).unlink(missing_ok=True)
    manifest = node.images / "gpuckpt-manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "dump_completed": False}))
    assert not read_manifest(str(node.images)).dump_completed
    with pytest.raises(ImageError, match="the dump of ctr never completed"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    manifest.write_text("not json")  # unreadable: the refusal stays the signature's
    with pytest.raises(SignatureError, match="has no gpuckpt-dump.sig"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))


def test_failed_gpu_restore_kills_the_half_restored_container(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 2)
    node.driver.fail_on[("restore", node.pids[1])] = "CUDA_ERROR_OUT_OF_MEMORY"
    with pytest.raises(GpuCheckpointError, match="the container was stopped"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert node.verbs_called()[-2:] == ["kill", "delete"]


# -- CRIU configuration belongs to the operator ----------------------------------------


@pytest.mark.hostile("annotation org.criu.config in the container's state, operator's default policy")
def test_container_criu_config_annotation_is_refused_before_anything_runs(make_node) -> None:
    node = make_node(1, gpu=False)
    state = json.loads((node.dir / "runtime.json").read_text())
    state["state"]["annotations"] = {"org.criu.config": "/tmp/evil.conf"}
    (node.dir / "runtime.json").write_text(json.dumps(state))
    with pytest.raises(Exception, match="org.criu.config='/tmp/evil.conf': a CRIU configuration chosen by the "
                                        "container is refused"):
        node.checkpoint()
    assert "checkpoint" not in node.verbs_called()


@pytest.mark.hostile("annotation org.criu.config in the restore bundle, operator's default policy")
def test_restore_from_a_bundle_with_the_annotation_is_refused(make_node) -> None:
    node = make_node(1, gpu=False)
    spec = json.loads((node.bundle / "config.json").read_text())
    spec["annotations"] = {"org.criu.config": "/tmp/evil.conf"}
    (node.bundle / "config.json").write_text(json.dumps(spec))
    with pytest.raises(Exception, match="criu.allow_container_config = true"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert "restore" not in node.verbs_called()


@pytest.mark.skipif(os.geteuid() != 0, reason="the allowed CRIU config file must be owned by root")
def test_operator_may_allow_the_annotation(make_node) -> None:
    node = make_node(1, gpu=False)
    site = node.dir / "criu"
    site.mkdir()
    (site / "site.conf").write_text("log-file=dump-site.log\n")
    write_config(node.dir, f'delegate = "{node.runtime}"\n[criu]\nallow_container_config = true\n'
                           f'container_config_dirs = ["{site}"]\n')
    state = json.loads((node.dir / "runtime.json").read_text())
    state["state"]["annotations"] = {"org.criu.config": str(site / "site.conf")}
    (node.dir / "runtime.json").write_text(json.dumps(state))
    assert node.checkpoint() == 0


@pytest.mark.hostile("io.gpuckpt.criu.tcp-established=always on a node whose operator said never")
def test_a_loosening_annotation_is_refused_before_anything_runs(make_node) -> None:
    node = make_node(1)
    write_config(node.dir, f'delegate = "{node.runtime}"\n[criu]\ntcp_established = "never"\n')
    spec = json.loads((node.bundle / "config.json").read_text())
    spec["annotations"] = {"io.gpuckpt.criu.tcp-established": "always"}
    (node.bundle / "config.json").write_text(json.dumps(spec))
    with pytest.raises(Exception, match="tcp-established='always', looser than the operator's 'never'"):
        node.checkpoint()
    assert node.driver.calls_of("lock") == [] and node.all_running()
    assert "checkpoint" not in node.verbs_called() and not node.images.exists()


@pytest.mark.hostile("annotation key org.criu.config=<path> in the restore bundle")
def test_restore_from_a_bundle_with_a_split_criu_config_key_is_refused(make_node) -> None:
    node = make_node(1, gpu=False)
    spec = json.loads((node.bundle / "config.json").read_text())
    spec["annotations"] = {"org.criu.config=/tmp/evil.conf": ""}
    (node.bundle / "config.json").write_text(json.dumps(spec))
    with pytest.raises(Exception, match="runc splits labels at the first '=' and would act on it as org.criu.config"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert "restore" not in node.verbs_called()


# -- suspend on pause (podman pause / docker pause of an opted-in container) ----------


def opt_in_to_suspend_on_pause(node: Node) -> None:
    setup = json.loads((node.dir / "runtime.json").read_text())
    setup["state"]["annotations"] = {"io.gpuckpt.suspend-on-pause": "true"}
    (node.dir / "runtime.json").write_text(json.dumps(setup))


def run_verb(node: Node, verb: str) -> int:
    return pause.run(parse_runtime_args(["--root", "/r", verb, "ctr"]), str(node.runtime), NodeGpus(**node.gpus))


@pytest.fixture
def suspendable(make_node, monkeypatch):
    node = make_node(2)
    opt_in_to_suspend_on_pause(node)
    node.gpus["descendants"] = lambda init: node.pids
    node.gpus["compute_processes"] = (lambda: {pid: {UUID0: 1 << 30} for pid in node.pids})
    node.gpus["list_gpus"] = (lambda: [
        GpuInfo(index=0, uuid=UUID0, name=H100, memory_total_bytes=80 << 30, memory_free_bytes=79 << 30, minor=0)])
    return node


def test_pause_suspends_before_the_freeze_and_resume_brings_back_after_the_thaw(suspendable) -> None:
    node = suspendable
    assert run_verb(node, "pause") == 0
    assert all(node.driver.states[pid] == ProcessState.CHECKPOINTED for pid in node.pids)
    assert node.verbs_called()[-1] == "pause" and read_suspension("ctr") is not None
    assert run_verb(node, "resume") == 0
    assert node.verbs_called()[-1] == "resume"
    assert node.all_running() and read_suspension("ctr") is None


def test_failed_pause_gives_the_gpu_back(suspendable) -> None:
    node = suspendable
    node.set_runtime(pause_status=1, state={"status": "running", "pid": node.pids[0], "bundle": str(node.bundle),
                                            "id": "ctr", "annotations": {"io.gpuckpt.suspend-on-pause": "true"}})
    assert run_verb(node, "pause") == 1
    assert node.all_running() and read_suspension("ctr") is None


def test_docker_checkpoint_of_a_suspended_pause_dumps_the_suspended_processes(suspendable) -> None:
    """containerd: pause, checkpoint, resume. The pause moved the GPU state; the dump takes it as it is."""
    node = suspendable
    assert run_verb(node, "pause") == 0
    assert node.checkpoint() == 0
    manifest = read_manifest(str(node.images))
    assert sorted(p.host_pid for p in manifest.processes) == sorted(node.pids)
    assert node.driver.calls_of("lock").count(node.pids[0]) == 1  # locked once, by the pause
    assert read_suspension("ctr") is None  # the dump ended the processes; the image holds them


def test_forked_children_are_released_before_the_lock_and_never_given_to_the_driver(make_node, monkeypatch) -> None:
    node = make_node(3)
    child = node.pids[2]
    node.driver = FakeDriver(node.pids[:2], forked_pids=[child])  # a DataLoader worker: NOT_INITIALIZED
    node.gpus["find_cuda_pids"] = lambda pids: sorted(node.pids)
    released: list[list[int]] = []
    node.gpus["release_forked_children"] = lambda pids: released.append(list(pids)) or []
    assert node.checkpoint() == 0
    assert released == [[child]]
    assert child not in node.driver.calls_of("lock") and child not in node.driver.calls_of("checkpoint")
    assert sorted(p.host_pid for p in read_manifest(str(node.images)).processes) == sorted(node.pids[:2])


def newcomer_node(make_node, statuses: list[int]) -> tuple[Node, int, list[list[int]]]:
    """Two CUDA processes and a third that begins holding the driver once the first dump has started (a compile
    pool initialising CUDA and forking its workers meanwhile): the driver answers NOT_INITIALIZED for it."""
    node = make_node(3)
    newcomer = node.pids[2]
    node.driver = FakeDriver(node.pids[:2], forked_pids=[newcomer])
    node.set_runtime(checkpoint_statuses=statuses)
    node.gpus["descendants"] = lambda pid: list(node.pids)
    def dumped() -> bool:
        return any("checkpoint" in call and "--image-path" in call for call in node.calls())
    node.gpus["find_cuda_pids"] = lambda pids: [pid for pid in pids if pid in node.pids[:2] or
                                                (pid == newcomer and dumped())]
    released: list[list[int]] = []
    node.gpus["release_forked_children"] = lambda pids: released.append(list(pids)) or []
    return node, newcomer, released


def test_a_process_that_takes_the_driver_during_the_checkpoint_gets_it_taken_again(make_node, capfd) -> None:
    node, newcomer, released = newcomer_node(make_node, [1, 0])
    node.set_runtime(checkpoint_statuses=[1, 0], checkpoint_stderr="criu failed: type NOTIFY errno 0\n")
    assert node.checkpoint() == 0
    checkpoint.release_stderr()  # as the verb's caller does at its end
    assert node.verbs_called().count("checkpoint") == 2
    assert released == [[newcomer]]  # seen by the second attempt, let go of the driver before its lock
    assert all(node.driver.calls_of("lock").count(pid) == 2 for pid in node.pids[:2])
    assert all(node.driver.calls_of("restore").count(pid) == 1 for pid in node.pids[:2])  # the first rolled back
    err = capfd.readouterr().err
    assert f"after process(es) {newcomer} began holding the GPU driver" in err
    assert err.count("criu failed") == 1  # the second dump's words only: the first one's were undone
    manifest = read_manifest(str(node.images))
    assert manifest.dump_completed and sorted(p.host_pid for p in manifest.processes) == sorted(node.pids[:2])


def test_a_retry_starts_from_what_the_first_attempt_found(make_node, monkeypatch) -> None:
    node, newcomer, _ = newcomer_node(make_node, [1, 0])
    node.set_runtime(checkpoint_statuses=[1, 0], checkpoint_failure_leaves="pages-9.img",
                     checkpoint_records_criu_config=True)
    monkeypatch.delenv("CRIU_CONFIG_FILE", raising=False)
    linked = iter([{"/dev/shm/sem.x (deleted)"}, set()])  # the first attempt needs link-remap, the second not
    monkeypatch.setattr(checkpoint, "link_remap_files", lambda pids: next(linked))
    assert node.checkpoint() == 0
    assert not (node.images / "pages-9.img").exists()  # the failed dump's image is not signed into the new one
    first, second = (node.dir / "criu_configs.log").read_text().split()
    assert first.endswith(".conf") and "link-remap" in Path(first).read_text()
    assert second == "-" or "link-remap" not in Path(second).read_text()  # not the first attempt's config
    assert read_manifest(str(node.images)).criu_config == [line for line in (
        Path(second).read_text().splitlines() if second != "-" else [])]


class SigtermOnRestoreDriver(FakeDriver):
    """Sends the shim SIGTERM as the rollback's first device restore begins (the engine gives up meanwhile)."""

    def restore(self, pid: int, gpu_pairs=()) -> None:
        if not self.calls_of("restore"):
            os.kill(os.getpid(), signal.SIGTERM)
        super().restore(pid, gpu_pairs)


def test_a_signal_during_the_first_rollback_takes_no_second_checkpoint(make_node) -> None:
    node, newcomer, _ = newcomer_node(make_node, [1, 0])
    node.driver = SigtermOnRestoreDriver(node.pids[:2], forked_pids=[newcomer])
    with pytest.raises(DelegateError) as raised:
        node.checkpoint()
    assert not isinstance(raised.value, checkpoint.DriverTakenMeanwhile)
    assert node.verbs_called().count("checkpoint") == 1
    assert all(node.driver.states[pid] == ProcessState.RUNNING for pid in node.pids[:2])


def test_the_checkpoint_is_taken_again_once_only(make_node) -> None:
    node, newcomer, released = newcomer_node(make_node, [1, 1, 0])
    with pytest.raises(DelegateError) as raised:
        node.checkpoint()
    assert raised.value.exit_status == 1 and "keeps running" in str(raised.value)
    assert node.verbs_called().count("checkpoint") == 2
    assert all(node.driver.states[pid] == ProcessState.RUNNING for pid in node.pids[:2])
    assert released == [[newcomer]]


def test_a_dump_failure_with_the_same_holders_is_not_taken_again(make_node) -> None:
    node = make_node(2)
    node.set_runtime(checkpoint_statuses=[1, 0])
    node.gpus["descendants"] = lambda pid: list(node.pids)
    with pytest.raises(DelegateError) as raised:
        node.checkpoint()
    assert not isinstance(raised.value, checkpoint.DriverTakenMeanwhile)
    assert node.verbs_called().count("checkpoint") == 1 and node.all_running()


@pytest.mark.hostile("a forked child of a CUDA process stopped (SIGSTOP) by the container before the checkpoint")
def test_a_forked_child_that_cannot_be_released_refuses_before_any_lock(make_node, monkeypatch) -> None:
    node = make_node(2)
    child = node.pids[1]
    node.driver = FakeDriver(node.pids[:1], forked_pids=[child])
    node.gpus["find_cuda_pids"] = lambda pids: sorted(node.pids)
    os.kill(child, signal.SIGSTOP)
    try:
        with pytest.raises(DelegateError, match=rf"forked child\(ren\) {child} .*stopped.*keeps running"):
            node.checkpoint()
    finally:
        os.kill(child, signal.SIGCONT)
    assert node.driver.calls_of("lock") == [] and "checkpoint" not in node.verbs_called()
    assert node.driver.states[node.pids[0]] == ProcessState.RUNNING
