"""A job that spans containers, checkpointed and restored as one (cuda/group.py, service/group.py, and the shim's
dump of a suspended container): every member locked before any is dumped, put back on the GPU only together,
and a member that fails any phase rolls the whole group back. The fake driver stands in at the driver seam;
tests/fake_podman.py for podman."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_driver import FakeDriver
from test_gpu_verbs import UUID0, checkpointed_node, make_node, restore_args, suspendable  # noqa: F401 -- fixtures

from gpuckpt.cli.main import build_parser
from gpuckpt.cuda.devices import GpuInfo
from gpuckpt.cuda.driver import ProcessState, call_error
from gpuckpt.cuda.group import GROUP_ENGINE, LOCK_ATTEMPTS, GroupMember, GroupSuspend
from gpuckpt.cuda.node import NodeGpus
from gpuckpt.errors import GpuCheckpointError, UsageError
from gpuckpt.node.suspension import (
    SuspendedProcess,
    Suspension,
    ask_standby_restore,
    read_suspension,
    write_suspension,
)
from gpuckpt.service.group import GroupFailed, GroupOptions, checkpoint_group, find_members, restore_group
from gpuckpt.shim import restore

RUNNING, LOCKED, CHECKPOINTED = ProcessState.RUNNING, ProcessState.LOCKED, ProcessState.CHECKPOINTED


class Group:
    """Members a and b (two sleeping "CUDA processes" each) and c (no CUDA process), labelled job; podman is
    tests/fake_podman.py on PATH."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_member: bool = True) -> None:
        self.dir = tmp_path / "podman"
        self.dir.mkdir()
        self.sleeps = {name: [subprocess.Popen(["sleep", "60"]) for _ in range(count)]
                       for name, count in (("a", 2), ("b", 2), ("c", 1))}
        self.pids = {name: [sleep.pid for sleep in sleeps] for name, sleeps in self.sleeps.items()}
        self.cuda_pids = self.pids["a"] + self.pids["b"]
        self.driver = FakeDriver(self.cuda_pids)
        names = ("a", "b", "c") if cpu_member else ("a", "b")
        self.setup = {"containers": {name: {"id": f"{name * 12}{'0' * 52}", "pid": self.pids[name][0],
                                            "status": "running",
                                            "labels": {"io.gpuckpt.group": "job"}, "cuda": name != "c"}
                                     for name in names}}
        self.write()
        shutil.copy(Path(__file__).parent / "fake_podman.py", self.dir / "fake_podman.py")  # podman.json beside it
        program = self.dir / "podman"
        program.write_text(f"#!/bin/sh\nexec {sys.executable} {self.dir / 'fake_podman.py'} \"$@\"\n")
        program.chmod(0o755)
        monkeypatch.setenv("PATH", f"{self.dir}:{os.environ['PATH']}")
        by_init = {pids[0]: pids for pids in self.pids.values()}
        self.gpus = NodeGpus(load_driver=lambda: self.driver, descendants=lambda init: by_init.get(init, []),
                             find_cuda_pids=lambda pids: [pid for pid in pids if pid in self.driver.states],
                             compute_processes=lambda: {pid: {UUID0: 1 << 30} for pid in self.cuda_pids},
                             list_gpus=lambda: [GpuInfo(0, UUID0, "H100", 80 << 30, 79 << 30, 0)])

    def write(self) -> None:
        (self.dir / "podman.json").write_text(json.dumps(self.setup))

    def fail(self, verb: str, name: str) -> None:
        self.setup = json.loads((self.dir / "podman.json").read_text())
        self.setup.setdefault("fail", {})[verb] = [name]
        self.write()

    def status(self) -> dict[str, str]:
        return {name: each["status"] for name, each in json.loads((self.dir / "podman.json").read_text())
                ["containers"].items()}

    def calls(self) -> list[dict]:
        log = self.dir / "calls.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def podman_verbs(self, verb: str) -> list[str]:
        return [call[verb] for call in self.calls() if verb in call]

    def states(self) -> set[ProcessState]:
        return {self.driver.states[pid] for pid in self.cuda_pids}

    def stop(self) -> None:
        for sleeps in self.sleeps.values():
            for sleep in sleeps:
                sleep.kill()
                sleep.wait()


@pytest.fixture
def group(tmp_path, monkeypatch, node):
    made = Group(tmp_path, monkeypatch)
    yield made
    made.stop()


def checkpoint(group: Group, **options) -> list[str]:
    return checkpoint_group(find_members("job"), GroupOptions(lock_timeout_ms=1000, **options), group.gpus)


# -- checkpoint -----------------------------------------------------------------------


def test_every_member_is_locked_before_any_is_checkpointed_and_all_before_any_dump(group: Group) -> None:
    assert checkpoint(group) == ["a", "b", "c"]
    calls = [name for name, _ in group.driver.calls if name in ("lock", "checkpoint")]
    assert calls == ["lock"] * 4 + ["checkpoint"] * 4  # the barrier: no device state moves before all are locked
    assert group.states() == {CHECKPOINTED}
    dumps = [call for call in group.calls() if "checkpoint" in call]
    assert [dump["checkpoint"] for dump in dumps] == ["a", "b", "c"]
    assert dumps[0]["suspended"] == ["a", "b"]  # at the first dump, every CUDA member was suspended already
    assert group.status() == {"a": "exited", "b": "exited", "c": "exited"}
    assert all(read_suspension(each["id"]) is None for each in group.setup["containers"].values())


def test_leave_running_brings_every_member_back_together_after_the_last_dump(group: Group) -> None:
    assert checkpoint(group, leave_running=True) == ["a", "b", "c"]
    assert group.states() == {RUNNING}
    restores = group.driver.calls_of("restore")
    unlocks = [index for index, (name, _) in enumerate(group.driver.calls) if name == "unlock"]
    assert sorted(restores) == sorted(group.cuda_pids)
    last_restore = max(index for index, (name, _) in enumerate(group.driver.calls) if name == "restore")
    assert min(unlocks) > last_restore  # no rank runs before every rank is back on the GPU
    assert group.status() == {"a": "running", "b": "running", "c": "running"}
    assert all(read_suspension(each["id"]) is None for each in group.setup["containers"].values())


@pytest.mark.parametrize("phase, step", [("lock", "CUDA lock"), ("checkpoint", "device checkpoint")])
def test_a_member_failing_a_gpu_phase_puts_every_member_back_and_is_named(group: Group, phase, step) -> None:
    group.driver.fail_on[(phase, group.pids["b"][1])] = "CUDA_ERROR_UNKNOWN"
    with pytest.raises(GroupFailed) as failed:
        checkpoint(group)
    line = str(failed.value)
    assert f"member b: {step} failed" in line and "every member keeps running as before" in line
    assert "\n" not in line
    assert group.states() == {RUNNING}
    assert group.podman_verbs("checkpoint") == []  # nothing was dumped
    assert all(read_suspension(each["id"]) is None for each in group.setup["containers"].values())


def test_a_member_whose_dump_fails_rolls_back_the_members_dumped_before_it(group: Group) -> None:
    group.fail("checkpoint", "b")
    with pytest.raises(GroupFailed) as failed:
        checkpoint(group)
    line = str(failed.value)
    assert "member b" in line and "refused by the stand-in" in line and "every member runs as before" in line
    assert "\n" not in line
    # a was dumped: restored into standby first, then every member's GPU state back together
    assert [(call["restore"], call["standby_requested"]) for call in group.calls() if "restore" in call] == \
        [("a", True)]
    assert group.podman_verbs("checkpoint") == ["a", "b"]  # c never dumped
    assert group.status() == {"a": "running", "b": "running", "c": "running"}
    assert group.states() == {RUNNING}
    assert all(read_suspension(each["id"]) is None for each in group.setup["containers"].values())


def test_a_member_that_cannot_be_put_back_is_named_with_its_checkpoint_kept(group: Group) -> None:
    group.fail("checkpoint", "c")
    setup = json.loads((group.dir / "podman.json").read_text())
    setup["fail"]["restore"] = ["a"]
    (group.dir / "podman.json").write_text(json.dumps(setup))
    with pytest.raises(GroupFailed, match="member a could not be restored .*its checkpoint is kept by podman"):
        checkpoint(group)
    assert group.status() == {"a": "exited", "b": "running", "c": "running"}
    assert {group.driver.states[pid] for pid in group.pids["b"]} == {RUNNING}  # the others run again


def test_a_suspended_member_or_one_not_running_is_refused_before_anything(group: Group) -> None:
    members = find_members("job")
    write_suspension(Suspension(container=members[0].container_id, engine="podman", init_pid=1, since="now",
                                processes=[]))
    with pytest.raises(Exception, match="member a is suspended already"):
        checkpoint_group(members, GroupOptions(), group.gpus)
    assert group.driver.calls == []


def test_a_group_of_cpu_containers_never_loads_the_driver(tmp_path, monkeypatch, node) -> None:
    made = Group(tmp_path, monkeypatch)
    try:
        made.driver.states.clear()  # no CUDA process anywhere

        def no_driver():
            raise AssertionError("a group without CUDA processes needs no driver")
        made.gpus = NodeGpus(load_driver=no_driver, descendants=made.gpus.descendants,
                             find_cuda_pids=lambda pids: [])
        for each in made.setup["containers"].values():
            each["cuda"] = False
        made.write()
        assert checkpoint(made) == ["a", "b", "c"]
        assert restore_group(find_members("job"), GroupOptions(), made.gpus) == ["a", "b", "c"]
    finally:
        made.stop()


# -- restore --------------------------------------------------------------------------


def checkpointed(group: Group) -> None:
    assert checkpoint(group) == ["a", "b", "c"]
    group.driver.calls.clear()


def test_restore_brings_device_state_back_only_once_every_member_is_restored(group: Group) -> None:
    checkpointed(group)
    assert restore_group(find_members("job"), GroupOptions(), group.gpus) == ["a", "b", "c"]
    assert [(call["restore"], call["standby_requested"]) for call in group.calls() if "restore" in call] == \
        [("a", True), ("b", True), ("c", True)]
    assert [name for name, _ in group.driver.calls if name in ("restore", "unlock")] == \
        ["restore"] * 4 + ["unlock"] * 4
    assert group.states() == {RUNNING}
    assert group.status() == {"a": "running", "b": "running", "c": "running"}
    assert not list((group.dir / "storage").glob("*/checkpoint"))  # kept (--keep) only while the group could fail


def test_a_member_whose_restore_fails_leaves_every_member_checkpointed(group: Group) -> None:
    checkpointed(group)
    group.fail("restore", "b")
    with pytest.raises(GroupFailed) as failed:
        restore_group(find_members("job"), GroupOptions(), group.gpus)
    assert "member b" in str(failed.value) and "every member is checkpointed as before" in str(failed.value)
    assert group.driver.calls_of("restore") == []  # no device state came back: a stayed in standby
    assert group.status() == {"a": "exited", "b": "exited", "c": "exited"}  # a stopped again (podman kept it)
    assert group.states() == {CHECKPOINTED}
    assert len(list((group.dir / "storage").glob("*/checkpoint/inventory.img"))) == 3  # every checkpoint kept


def test_a_failed_device_restore_puts_every_member_back_checkpointed(group: Group) -> None:
    checkpointed(group)
    group.driver.fail_on[("restore", group.pids["b"][0])] = "CUDA_ERROR_OUT_OF_MEMORY"
    with pytest.raises(GroupFailed, match="member b: device restore failed .*CUDA_ERROR_OUT_OF_MEMORY"):
        restore_group(find_members("job"), GroupOptions(), group.gpus)
    assert group.states() == {CHECKPOINTED}
    assert group.driver.calls_of("unlock") == []
    assert group.status() == {"a": "exited", "b": "exited", "c": "exited"}


def test_restore_refuses_members_not_checkpointed(group: Group) -> None:
    with pytest.raises(Exception, match=r"running: a, b, c"):
        restore_group(find_members("job"), GroupOptions(), group.gpus)
    assert group.podman_verbs("restore") == []


# -- cuda/group.py alone ----------------------------------------------------------------


def test_group_suspend_records_each_cuda_member_with_the_group_engine(group: Group) -> None:
    members = [GroupMember(name, f"{name}-id", pids[0]) for name, pids in group.pids.items()]
    records = GroupSuspend(members, group.gpus).suspend(1000)
    assert [record.container for record in records] == ["a-id", "b-id"]  # c holds no CUDA process: no record
    assert {record.engine for record in records} == {GROUP_ENGINE}
    assert read_suspension("a-id").processes[0].device_bytes == 1 << 30


def test_group_suspend_interrupted_puts_every_member_back(group: Group, monkeypatch) -> None:
    members = [GroupMember(name, f"{name}-id", pids[0]) for name, pids in group.pids.items()]

    def interrupted(record) -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr("gpuckpt.cuda.group.write_suspension", interrupted)
    with pytest.raises(GpuCheckpointError, match="interrupted.*every member keeps running"):
        GroupSuspend(members, group.gpus).suspend(1000)
    assert group.states() == {RUNNING}


# -- the shim's dump of a suspended container --------------------------------------------


@pytest.mark.parametrize("engine", ["podman", GROUP_ENGINE])
def test_a_suspended_container_is_dumped_as_it_is(suspendable, engine) -> None:  # noqa: F811
    node = suspendable
    for pid in node.pids:
        node.driver.lock(pid, 0)
        node.driver.checkpoint(pid)
    write_suspension(Suspension(container="ctr", engine=engine, init_pid=node.pids[0], since="now",
                                processes=[SuspendedProcess(pid=pid, gpu_uuids=[UUID0]) for pid in node.pids]))
    assert node.checkpoint() == 0
    assert node.driver.calls_of("lock") == node.pids  # only the suspension's locks: the shim locked nothing
    assert "checkpoint" in node.verbs_called()
    assert read_suspension("ctr") is None  # the dump ended the processes; the image holds them


def test_leave_running_keeps_a_suspended_container_suspended(suspendable) -> None:  # noqa: F811
    node = suspendable
    for pid in node.pids:
        node.driver.lock(pid, 0)
        node.driver.checkpoint(pid)
    write_suspension(Suspension(container="ctr", engine=GROUP_ENGINE, init_pid=node.pids[0], since="now",
                                processes=[SuspendedProcess(pid=pid) for pid in node.pids]))
    assert node.checkpoint("--leave-running") == 0
    assert {node.driver.states[pid] for pid in node.pids} == {CHECKPOINTED}
    assert read_suspension("ctr") is not None  # the group brings it back with the others


def test_a_record_whose_processes_run_again_is_refused(suspendable) -> None:  # noqa: F811
    node = suspendable
    node.driver.lock(node.pids[0], 0)
    node.driver.checkpoint(node.pids[0])  # the second one runs: a dump would take its GPU state with it
    write_suspension(Suspension(container="ctr", engine="podman", init_pid=node.pids[0], since="now",
                                processes=[SuspendedProcess(pid=pid) for pid in node.pids]))
    with pytest.raises(GpuCheckpointError, match=f"recorded as suspended .*{node.pids[1]} are not checkpointed"):
        node.checkpoint()
    assert "checkpoint" not in node.verbs_called()
    assert node.driver.states[node.pids[1]] == RUNNING


def test_a_standby_request_restores_into_standby_once(make_node, monkeypatch) -> None:  # noqa: F811
    node = checkpointed_node(make_node, monkeypatch)
    ask_standby_restore("ctr")
    assert restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus)) == 0
    assert {node.driver.states[pid] for pid in node.pids} == {CHECKPOINTED}
    assert node.driver.calls_of("restore") == [] and node.driver.calls_of("unlock") == []
    record = read_suspension("ctr")
    assert record is not None and record.engine == "standby"
    assert not (Path(os.environ["GPUCKPT_STATE_DIR"]) / "standby-requests" / "ctr").exists()  # used up



# -- the command line -----------------------------------------------------------------


@pytest.mark.parametrize("argv, said", [
    (["restore", "--group", "job", "web"], "give it or CHECKPOINT ('web'), not both"),
    (["restore", "--group", "job", "--name", "x", "--tcp-established"], "--name not allowed with it"),
    (["restore"], "give CHECKPOINT (a stored checkpoint's name or an archive) or --group LABEL"),
    (["checkpoint", "--group", "a=b"], "--group 'a=b': give the value of the label io.gpuckpt.group"),
])
def test_the_group_commands_refuse_what_does_not_fit_in_one_line(group: Group, argv, said) -> None:
    options = build_parser().parse_args(argv)
    with pytest.raises(UsageError) as refused:
        options.handler(options)
    assert said in str(refused.value) and "\n" not in str(refused.value)
    assert group.podman_verbs("checkpoint") == [] and group.podman_verbs("restore") == []


class OnceTimedOut(FakeDriver):
    """The first lock of one pid times out (its rank caught mid-collective), the next ones succeed."""

    def __init__(self, pids, slow_pid: int) -> None:
        super().__init__(pids)
        self.slow_pid, self.timed_out = slow_pid, False

    def lock(self, pid: int, timeout_ms: int) -> None:
        if pid == self.slow_pid and not self.timed_out:
            self.timed_out = True
            self._enter("lock", pid)
            raise call_error("lock", pid, "CUDA_ERROR_TIMEOUT", timeout_ms)
        super().lock(pid, timeout_ms)


def test_a_group_lock_that_timed_out_is_tried_again_after_every_member_unlocked(group: Group) -> None:
    group.driver = OnceTimedOut(group.cuda_pids, group.pids["b"][0])
    assert checkpoint(group) == ["a", "b", "c"]
    assert group.driver.calls_of("lock").count(group.pids["b"][0]) == 2
    assert sorted(group.driver.calls_of("unlock")) == sorted(set(group.cuda_pids) - {group.pids["b"][0]})
    assert group.states() == {CHECKPOINTED}


def test_a_group_lock_that_keeps_timing_out_fails_after_its_attempts(group: Group) -> None:
    group.driver.fail_on[("lock", group.pids["a"][1])] = "CUDA_ERROR_TIMEOUT"
    with pytest.raises(GroupFailed, match=r"member a: CUDA lock \(3 attempts\) failed .*every member keeps running"):
        checkpoint(group)
    assert group.driver.calls_of("lock").count(group.pids["a"][1]) == LOCK_ATTEMPTS
    assert group.states() == {RUNNING}
    assert group.podman_verbs("checkpoint") == []
