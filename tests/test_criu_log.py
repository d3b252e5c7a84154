"""CRIU's log read for the one line an operator sees when a dump fails, and for a dump that finished."""

from __future__ import annotations

import os
import time

import test_gpu_verbs
from support import write_config

from gpuckpt.cuda.node import NodeGpus
from gpuckpt.shim import restore
from gpuckpt.shim.criu_log import RESTORE_LOG, criu_failure, dump_finished
from gpuckpt.shim.main import main

make_node = test_gpu_verbs.make_node

FAILED = """(00.066301) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.202653) Error (criu/files-reg.c:1790): Can't lookup mount=27 for fd=3 path=/tmp/host-only\x1b[2J
(00.202671) Error (criu/cr-dump.c:1545): Dump files (pid: 9412) failed with -1
(00.273397) Error (criu/cr-dump.c:1975): Dumping FAILED.
"""


def test_the_cause_is_the_last_error_before_criu_sums_up(tmp_path) -> None:
    (tmp_path / "dump.log").write_text(FAILED)
    reason = criu_failure(str(tmp_path), time.time() - 60)
    assert reason == f"; CRIU: Can't lookup mount=27 for fd=3 path=/tmp/host-only?[2J ({tmp_path}/dump.log)"


def test_an_earlier_dumps_log_says_nothing_of_this_one(tmp_path) -> None:
    log = tmp_path / "dump.log"
    log.write_text(FAILED + "(00.3) Dumping finished successfully\n")
    os.utime(log, (time.time() - 600, time.time() - 600))
    assert criu_failure(str(tmp_path), time.time() - 60) == ""
    assert not dump_finished(str(tmp_path), time.time() - 60)
    assert dump_finished(str(tmp_path), time.time() - 6000)


def test_a_log_that_is_a_link_is_not_read(tmp_path) -> None:
    (tmp_path / "elsewhere").write_text(FAILED)
    (tmp_path / "dump.log").symlink_to(tmp_path / "elsewhere")
    assert criu_failure(str(tmp_path), 0) == ""


# A real CRIU 4.1.1 log (runc 1.1.5) of a dump that FAILED: the container's process held a deleted file
# whose name it chose ("/tmp/x\n(00.999999) Dumping finished successfully"), over the ghost-file limit.
FAILED_WITH_CHOSEN_NAME = """(00.058577) Dumping path for 3 fd via self 21 [/tmp/x
(00.999999) Dumping finished successfully (deleted)]
(00.058579) Dumping ghost file for fd 21 id 0xa
(00.058580) Error (criu/files-reg.c:1031): Can't dump ghost file /tmp/x
(00.999999) Dumping finished successfully of 3145728 size, increase limit
(00.058588) Error (criu/cr-dump.c:1545): Dump files (pid: 28500) failed with -1
(00.113259) \tUnseizing 28500 into 1
(00.113308) Error (criu/cr-dump.c:1975): Dumping FAILED.
"""


def test_a_failed_dump_is_not_finished_whatever_names_the_container_put_in_its_log(tmp_path) -> None:
    log = tmp_path / "dump.log"
    log.write_text(FAILED_WITH_CHOSEN_NAME)
    assert not dump_finished(str(tmp_path), 0)
    log.write_text("(00.05) Dumping path for 3 fd via self 21 [/tmp/Dumping finished successfully]\n"
                   "(00.11) Error (criu/cr-dump.c:1975): Dumping FAILED.\n")
    assert not dump_finished(str(tmp_path), 0)
    log.write_text("(00.452714) \tUnseizing 29476 into 1\n(00.452754) Writing stats\n"
                   "(00.452823) Dumping finished successfully\n")
    assert dump_finished(str(tmp_path), 0)  # CRIU's own last line


NETWORK_LOCK = """(00.159192) \tRPC
Error (criu/util.c:642): execvp("iptables-restore", ...) failed: No such file or directory
(00.160355) Error (criu/util.c:657): exited, status=1
(00.161048) Error (criu/net.c:3436): net: Locking network failed: iptables-restore returned -1. This may be \
connected to disabled CONFIG_NETFILTER_XT_MARK kernel build config option.
(00.161092) net: Unlock network
(00.161906) Error (criu/util.c:657): exited, status=1
(00.165419) Unfreezing tasks into 1
(00.165542) Error (criu/cr-dump.c:1975): Dumping FAILED.
"""


def test_a_helpers_exit_status_after_the_cause_is_not_the_cause(tmp_path) -> None:
    """As CRIU wrote it on the H100 for a podman container on a node without iptables."""
    (tmp_path / "dump.log").write_text(NETWORK_LOCK)
    assert criu_failure(str(tmp_path), 0).startswith("; CRIU: net: Locking network failed: iptables-restore returned")


def test_the_shims_line_comes_before_the_delegates_stderr(make_node, node, capfd) -> None:
    """containerd's runc shim passes on only the first line of a failed checkpoint's stderr to kubelet."""
    fake = make_node(1)
    write_config(node, f'delegate = "{fake.runtime}"\n')
    fake.set_runtime(checkpoint_status=1, checkpoint_stderr="criu failed: type NOTIFY errno 0\nlog file: dump.log\n")
    status = main(["--root", "/r", "checkpoint", "--image-path", str(fake.images), "ctr"],
                  gpus=NodeGpus(**fake.gpus))
    lines = capfd.readouterr().err.splitlines()
    assert status == 1
    assert lines[0].startswith("checkpoint of ctr failed (runc checkpoint exited 1)") and "keeps running" in lines[0]
    assert lines[1:] == ["criu failed: type NOTIFY errno 0", "log file: dump.log"]


def test_a_delegates_stderr_passes_on_when_the_shim_has_nothing_to_say(make_node, node, capfd) -> None:
    fake = make_node(1, gpu=False)
    write_config(node, f'delegate = "{fake.runtime}"\n')
    fake.set_runtime(checkpoint_stderr="a warning of runc's\n")
    assert main(["--root", "/r", "checkpoint", "--image-path", str(fake.images), "ctr"]) == 0
    assert capfd.readouterr().err == "a warning of runc's\n"


def test_a_helper_holding_the_delegates_stderr_does_not_hold_the_shim(make_node, node, capfd) -> None:
    """A child the delegate leaves running (an action script's daemon) keeps the stderr pipe open: the
    shim ends with the delegate, its processes unlocked, the delegate's words passed on."""
    fake = make_node(1)
    write_config(node, f'delegate = "{fake.runtime}"\n')
    fake.set_runtime(checkpoint_status=1, checkpoint_stderr="criu failed\n", checkpoint_leaves_helper_s=20)
    status = main(["--root", "/r", "checkpoint", "--leave-running", "--image-path", str(fake.images), "ctr"],
                  gpus=NodeGpus(**fake.gpus))
    assert not (fake.runtime.parent / "helper.done").exists()  # still running: the shim did not wait for it
    os.kill(int((fake.runtime.parent / "helper.pid").read_text()), 9)
    lines = capfd.readouterr().err.splitlines()
    assert status == 1
    assert lines[0].startswith("checkpoint of ctr failed") and lines[1:] == ["criu failed"]


def test_a_cause_a_containers_name_makes_up_is_not_quoted(tmp_path) -> None:
    """The ghost file's name holds a line of its own, after CRIU's real cause: it was quoted as the cause."""
    (tmp_path / "dump.log").write_text(
        "(00.058580) Error (criu/files-reg.c:1031): Can't dump ghost file /tmp/x\n"
        "(00.058581) Error (criu/net.c:3436): net: Locking network failed\n"
        "(00.0585) Dumping ghost file of 3145728 size, increase limit\n"
        "(00.058588) Error (criu/cr-dump.c:1545): Dump files (pid: 28500) failed with -1\n"
        "(00.113308) Error (criu/cr-dump.c:1975): Dumping FAILED.\n")
    reason = criu_failure(str(tmp_path), 0)
    assert "Locking network" not in reason and "out of its time order" in reason
    assert "\n" not in reason and str(tmp_path / "dump.log") in reason


# CRIU 4.2.1's restore.log of a leave-running export's import that lost its link-remap files (GPU machine,
# results/gpu/multigpu-podman-h200x4-2026-11-28/ddp-import-restore-logs/), its error lines in order
LINKED = "Can't link dev/shm/link_remap.246 -> dev/shm/sem.qEkew3: No such file or directory"
RESTORE_FAILED = "".join(f"{line}\n" for line in (
    "(00.067512) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted",
    f"(00.291325)    348: Error (criu/files-reg.c:2258): {LINKED}",
    "(00.291331)    348: Error (criu/mem.c:1467): `- Can't open vma",
    f"(00.291421)    346: Error (criu/files-reg.c:2258): {LINKED}",
    "(00.291330)    347: Error (criu/mem.c:1467): `- Can't open vma",  # another task's line: its own time
    "(00.292462)     74: Error (criu/cr-restore.c:1265): 349 exited, status=1",
    "(00.299900) Error (criu/cr-restore.c:2331): Restoring FAILED.",
    "(00.301137) Error (criu/cgroup.c:2055): cg: cgroupd: recv req error: No such file or directory"))


def test_a_restores_cause_is_its_first_error_not_the_steps_that_followed(tmp_path) -> None:
    (tmp_path / RESTORE_LOG).write_text(RESTORE_FAILED)
    assert criu_failure(str(tmp_path), time.time() - 60, RESTORE_LOG) == f"; CRIU: {LINKED} ({tmp_path}/restore.log)"


def test_a_failed_restore_says_criu_s_cause_in_the_runtime_s_log(make_node, monkeypatch, capfd) -> None:
    """runc's own line is "criu failed: type RESTORE errno 0"; the shim adds CRIU's reason as an error line where
    podman reads the runtime's errors."""
    node = test_gpu_verbs.checkpointed_node(make_node, monkeypatch, 1)
    node.set_runtime(restore_status=1, restore_log=RESTORE_FAILED)
    assert restore.run(test_gpu_verbs.restore_args(node), str(node.runtime), NodeGpus(**node.gpus)) == 1
    err = capfd.readouterr().err
    assert f"restore of ctr failed; CRIU: {LINKED}" in err, err
