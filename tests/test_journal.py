"""The journal a killed shim leaves, and what the next owned verb makes of it (#16 items 1 and 4).

The shim's own SIGKILL is tried for real in integration/test_faults.py; here each journal is
written as a killed shim would have left it (by a process that has ended), over the fake
driver's processes, and the next verb on the container must finish it before its own work.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import test_gpu_verbs
from test_gpu_verbs import checkpointed_node, restore_args

from gpuckpt.cuda.driver import ProcessState
from gpuckpt.cuda.node import NodeGpus
from gpuckpt.errors import ImageError
from gpuckpt.node import journal
from gpuckpt.node.journal import Journal, process_record, read_journal, write_journal
from gpuckpt.node.lock import BusyError, ContainerLock, StateKey
from gpuckpt.oci.manifest import read_manifest
from gpuckpt.shim import recover, restore
from gpuckpt.shim.staging import make_staging_dir

make_node = test_gpu_verbs.make_node
CTR = StateKey.of("ctr", "/r")  # the fake node's container: ID ctr, --root /r


def dead_pid() -> int:
    """The PID of a process that has ended: the killed shim."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def left_journal(node, phase: str, **fields) -> Journal:
    """The journal a shim killed at `phase` of a checkpoint of the fake node's container leaves."""
    records = [process_record(pid, pid) for pid in node.pids]
    left = Journal(container="ctr", verb="checkpoint", phase=phase, boot_id=journal.boot_id(), shim_pid=dead_pid(),
                   global_argv=["--root", "/r"], root="/r", image_dir=str(node.images), work_dir=str(node.images),
                   gpu=True, processes=[record for record in records if record is not None], **fields)
    write_journal(left)
    return left


def test_the_next_checkpoint_resumes_what_a_killed_shim_left_locked_then_checkpoints(make_node) -> None:
    node = make_node(3)
    node.driver.states[node.pids[0]] = ProcessState.CHECKPOINTED  # killed between the device checkpoints
    node.driver.states[node.pids[1]] = ProcessState.LOCKED
    left_journal(node, "gpu_checkpoint")
    node.driver.initialized = False
    assert node.checkpoint("--leave-running") == 0
    assert node.all_running()
    assert read_journal(CTR) is None
    resumed = [call for call in node.driver.calls if call[0] in ("restore", "unlock")]
    assert ("restore", node.pids[0]) in resumed and ("unlock", node.pids[1]) in resumed
    assert read_manifest(str(node.images)).dump_completed


def test_a_process_that_took_a_journaled_pid_is_never_touched(make_node) -> None:
    node = make_node(2)
    left = left_journal(node, "gpu_checkpoint")
    reused = left.processes[0].model_copy(update={"start_time": left.processes[0].start_time - 1})
    write_journal(left.model_copy(update={"processes": [reused, left.processes[1]]}))
    node.driver.states[node.pids[0]] = ProcessState.LOCKED  # another tool's lock, on a PID the journal once named
    node.driver.states[node.pids[1]] = ProcessState.LOCKED
    lines: list[str] = []
    assert recover.finish_left_journal(CTR, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    assert node.driver.states[node.pids[0]] == ProcessState.LOCKED
    assert node.driver.states[node.pids[1]] == ProcessState.RUNNING
    assert len(lines) == 1 and "1 CUDA process(es) running again" in lines[0] and "pid" in lines[0]


def write_dump_log(node, text: str, age_s: float = 0.0) -> None:
    log = node.images / "dump.log"
    log.write_text(text)
    os.utime(log, (time.time() - age_s, time.time() - age_s))


def incomplete_image(node) -> None:
    node.set_runtime(checkpoint_status=1)
    with pytest.raises(Exception):
        node.checkpoint()
    node.set_runtime()
    assert not read_manifest(str(node.images)).dump_completed


def test_a_dump_that_completed_after_the_shim_was_killed_is_marked_complete(make_node) -> None:
    node = make_node(2)
    incomplete_image(node)
    left_journal(node, "dump", dump_began=time.time() - 5)
    write_dump_log(node, "(00.5) Dumping finished successfully\n")
    for pid in node.pids:  # the dump ended them; here they are checkpointed and gone from the driver's view
        node.driver.states[pid] = ProcessState.CHECKPOINTED
    lines: list[str] = []
    recover.finish_left_journal(CTR, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    assert read_manifest(str(node.images)).dump_completed
    assert "marked complete" in lines[0]


def test_a_staged_dump_that_cannot_be_moved_still_lets_the_processes_resume(make_node, request) -> None:
    node = make_node(2)
    incomplete_image(node)
    staged = Path(make_staging_dir())  # where the shim stages (the recovery takes no other directory for one)
    request.addfinalizer(lambda: shutil.rmtree(staged, ignore_errors=True))
    (staged / "pages-1.img").write_text("x")
    (node.images / "pages-1.img").mkdir()  # where the image goes, something that cannot be replaced
    (node.images / "pages-1.img" / "x").write_text("")
    left_journal(node, "dump", dump_began=time.time() - 5, staging_dir=str(staged), leave_running=True)
    write_dump_log(node, "(00.5) Dumping finished successfully\n")
    for pid in node.pids:
        node.driver.states[pid] = ProcessState.LOCKED
    lines: list[str] = []
    assert recover.finish_left_journal(CTR, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    assert node.all_running() and not staged.exists()
    assert "stays marked incomplete" in lines[0] and "2 CUDA process(es) running again" in lines[0]


def test_an_earlier_dumps_log_does_not_complete_an_image(make_node) -> None:
    node = make_node(2)
    incomplete_image(node)
    left_journal(node, "dump", dump_began=time.time())
    write_dump_log(node, "(00.5) Dumping finished successfully\n", age_s=60)  # the last checkpoint's log
    lines: list[str] = []
    recover.finish_left_journal(CTR, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    assert not read_manifest(str(node.images)).dump_completed
    assert "stays marked incomplete" in lines[0]


def test_a_journal_of_another_boot_touches_no_process(make_node) -> None:
    node = make_node(2)
    incomplete_image(node)
    left = left_journal(node, "dump", dump_began=time.time() - 5)
    write_journal(left.model_copy(update={"boot_id": "00000000-0000-0000-0000-000000000000"}))
    node.driver.states[node.pids[0]] = ProcessState.LOCKED  # PIDs of this boot that the journal's names match
    write_dump_log(node, "(00.5) Dumping finished successfully\n")
    lines: list[str] = []
    recover.finish_left_journal(CTR, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    assert node.driver.states[node.pids[0]] == ProcessState.LOCKED
    assert read_manifest(str(node.images)).dump_completed  # the image on disk outlived the reboot
    assert "before the reboot" in lines[0]


def test_a_delegate_left_running_is_waited_for_then_refused_with_one_line(make_node, monkeypatch) -> None:
    node = make_node(1)
    dumping = subprocess.Popen(["sleep", "30"])
    try:
        record = process_record(dumping.pid, 0)
        left_journal(node, "dump", delegate_pid=dumping.pid, delegate_start_time=record.start_time,
                     dump_began=time.time())
        monkeypatch.setattr(recover, "ORPHAN_WAIT_S", 0.3)
        with pytest.raises(BusyError) as raised:
            node.checkpoint()
        assert "\n" not in str(raised.value) and f"delegate (pid {dumping.pid})" in str(raised.value)
        assert read_journal(CTR) is not None  # still to be finished
        assert "checkpoint" not in node.verbs_called()
    finally:
        dumping.kill()
        dumping.wait()


def test_the_next_restore_finishes_a_gpu_restore_a_killed_shim_left(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 2)
    records = [process_record(pid, pid) for pid in node.pids]
    write_journal(Journal(container="ctr", verb="restore", phase="gpu_restore", boot_id=journal.boot_id(),
                          shim_pid=dead_pid(), global_argv=["--root", "/r"], root="/r", image_dir=str(node.images),
                          gpu=True, processes=[record for record in records if record is not None]))
    lines: list[str] = []
    assert recover.finish_left_journal(CTR, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    assert node.all_running()
    assert "2 CUDA process(es) restored to the GPU and unlocked" in lines[0]


def test_a_second_operation_on_the_container_is_refused_while_one_runs(make_node) -> None:
    node = make_node(1)
    with ContainerLock(CTR, "checkpoint"):
        with pytest.raises(BusyError) as raised:
            restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    message = str(raised.value)
    assert "\n" not in message and f"(pid {os.getpid()}, checkpoint)" in message and "nothing was touched" in message
    assert node.calls() == []


def test_a_killed_holder_releases_the_lock(node) -> None:
    ready = os.pipe()
    child = os.fork()
    if child == 0:  # takes the lock, then is killed holding it
        with ContainerLock(CTR, "checkpoint"):
            os.write(ready[1], b"x")
            time.sleep(60)
        os._exit(0)
    os.read(ready[0], 1)
    with pytest.raises(BusyError):
        ContainerLock(CTR, "restore").__enter__()
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    with ContainerLock(CTR, "restore"):
        pass


def test_journal_names_are_runc_container_ids_only(node) -> None:
    with pytest.raises(ImageError, match="cannot name a journal"):
        read_journal(StateKey.of("../etc/passwd", "/r"))


def test_a_checkpoint_removes_its_journal_whichever_way_it_ends(make_node) -> None:
    node = make_node(2)
    assert node.checkpoint() == 0
    assert read_journal(CTR) is None
    node.driver.fail_on[("lock", node.pids[1])] = "CUDA_ERROR_TIMEOUT"
    for pid in node.pids:
        node.driver.states[pid] = ProcessState.RUNNING
    with pytest.raises(Exception):
        node.checkpoint()
    assert read_journal(CTR) is None and node.all_running()


def test_doctor_names_journals_no_live_gpuckpt_holds(make_node) -> None:
    from gpuckpt.cli.doctor import CheckFailed, check_journals

    node = make_node(1)
    assert "no checkpoint or restore left unfinished" in check_journals()
    left_journal(node, "gpu_checkpoint")
    with ContainerLock(CTR, "checkpoint"):  # a live shim's work in progress
        assert journal.left_journals() == []
    with pytest.raises(CheckFailed) as failed:
        check_journals()
    assert "1 checkpoint(s) or restore(s) a killed gpuckpt-runtime left unfinished (ctr)" in str(failed.value)
    assert failed.value.fix == "gpuckpt recover"


def test_a_delete_leaves_the_lock_file_of_a_gpuckpt_at_work(node) -> None:
    from gpuckpt.shim import delete
    from gpuckpt.shim.argv import parse_runtime_args

    with ContainerLock(CTR, "recover"):  # gpuckpt recover finishing a journal while the engine deletes
        assert delete.run(parse_runtime_args(["--root", "/r", "delete", "ctr"]), "/bin/true") == 0
        with pytest.raises(BusyError):
            ContainerLock(CTR, "restore").__enter__()  # not a second holder through a new lock file
    assert delete.run(parse_runtime_args(["--root", "/r", "delete", "ctr"]), "/bin/true") == 0
    assert not os.listdir(node / "state" / "locks")  # nobody held it: it went


def test_one_id_under_two_roots_is_two_containers(node) -> None:
    """runc's state is per root: the lock of ctr under /r does not stop ctr under /other, as runc would not."""
    with ContainerLock(CTR, "checkpoint"):
        with ContainerLock(StateKey.of("ctr", "/other"), "checkpoint"):
            pass
        with pytest.raises(BusyError):
            ContainerLock(StateKey.of("ctr", "/r/"), "restore").__enter__()  # a trailing slash: the same root


def test_a_root_is_named_as_runc_resolves_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuckpt.shim.argv import parse_runtime_args

    (tmp_path / "state").mkdir()
    monkeypatch.chdir(tmp_path)
    roots = {parse_runtime_args([*given, "checkpoint", "ctr"]).runtime_root("/usr/sbin/runc")
             for given in (["--root", "state"], ["--root=state/"], ["--root", f"{tmp_path}/state"])}
    assert roots == {f"{tmp_path.resolve()}/state"}
    assert parse_runtime_args(["checkpoint", "ctr"]).runtime_root("/usr/sbin/runc") == "/run/runc"  # runc's default


def test_key_names_stay_readable_and_bounded() -> None:
    assert CTR.name.startswith("ctr@") and CTR.name == StateKey.of("ctr", "/r").name
    assert StateKey.of("ctr", "/r").name != StateKey.of("ctr", "/s").name
    long = StateKey.of("a" * 1024, "/r")
    assert len(f"{long.name}.json") <= 255 and long.name.startswith("a" * 100)
    assert StateKey.listed(long.name).container == "a" * 160 and StateKey.listed(CTR.name).container == "ctr"
    assert StateKey.listed("ctr") == StateKey.legacy("ctr")  # the layout before roots


def test_a_journal_of_the_layout_before_roots_is_finished_under_the_root_it_names(make_node) -> None:
    """A journal an older gpuckpt left (named by the ID alone, no root field): the next verb on that ID under the
    root its global options name finishes it; under another root it is not that container's."""
    node = make_node(2)
    node.driver.states[node.pids[0]] = ProcessState.LOCKED
    left = left_journal(node, "gpu_checkpoint").model_copy(update={"root": ""})
    journal.remove_journal(CTR)
    write_journal(left)
    assert read_journal(StateKey.legacy("ctr")) is not None
    lines: list[str] = []
    other = StateKey.of("ctr", "/other")
    with ContainerLock(other, "checkpoint"):
        assert not recover.finish_left_journal(other, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    with ContainerLock(StateKey.legacy("ctr"), "checkpoint"):  # an older shim still at work on it
        with ContainerLock(CTR, "checkpoint"), pytest.raises(BusyError):
            recover.finish_left_journal(CTR, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    pending = journal.pending_journals()
    assert pending == [StateKey.legacy("ctr")] and journal.left_journals() == pending
    with ContainerLock(CTR, "checkpoint"):
        assert recover.finish_left_journal(CTR, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    assert read_journal(StateKey.legacy("ctr")) is None and node.all_running()
    assert "a killed gpuckpt-runtime" in lines[-1]


def test_a_journal_is_finished_with_the_delegate_that_wrote_it(make_node, tmp_path: Path) -> None:
    """A shim called as crun (shim/resolve.py delegate_named) journals crun: finishing its work later, whoever
    asks (gpuckpt recover resolves the configured delegate), asks crun about the container, not the other one."""
    node = make_node(2)
    crun = tmp_path / "other" / "crun"
    crun.parent.mkdir()
    crun.write_text(f'#!/bin/sh\necho "$@" >> {crun.parent / "calls"}\nexec {node.runtime} "$@"\n')
    crun.chmod(0o755)
    left_journal(node, "gpu_checkpoint", delegate=str(crun))
    lines: list[str] = []
    assert recover.finish_left_journal(CTR, str(node.runtime), NodeGpus(**node.gpus), lines.append)
    assert "state ctr" in (crun.parent / "calls").read_text()
    assert read_journal(CTR) is None
