"""podman through gpuckpt-runtime: run/exec/stop/rm and checkpoint/restore, runc and crun."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bed import (
    COUNTER_SOURCE,
    LATE_FILES_COUNTER,
    PODMAN_IMAGE,
    RUNTIME,
    TCP_HOLDER_SOURCE,
    assert_continues,
    configured_delegate,
    make_stale_hierarchy,
    remove_stale_hierarchy,
    sh,
    wait_counter,
)

from gpuckpt.host.cgroup_v1 import hybrid_or_legacy
from gpuckpt.shim.resident.call import helper_listens

_names = itertools.count()


class PodmanContainer:
    def __init__(self, runtime_flag: list[str]) -> None:
        self.name = f"gpuckpt-it-{os.getpid()}-{next(_names)}"
        self.podman = ["podman", *runtime_flag]

    def run(self, source: str = COUNTER_SOURCE) -> None:
        sh(*self.podman, "run", "-d", "--name", self.name, "--network", "none", PODMAN_IMAGE, "python3", "-c", source)

    def state(self) -> str:
        return sh(*self.podman, "exec", self.name, "cat", "/tmp/state").stdout

    def status(self) -> str:
        return sh("podman", "inspect", "--format", "{{.State.Status}}", self.name).stdout.strip()

    def assert_running(self) -> None:
        """Running, or the state and logs that say why not (a rare failure seen once in CI)."""
        status = self.status()
        if status != "running":
            state = sh("podman", "inspect", "--format", "{{json .State}}", self.name, check=False).stdout.strip()
            logs = sh("podman", "logs", self.name, check=False)
            ident = sh("podman", "inspect", "--format", "{{.Id}}", self.name, check=False).stdout.strip()
            oci_log = Path(f"/run/containers/storage/overlay-containers/{ident}/userdata/oci-log")
            runtime_log = oci_log.read_text()[-1500:] if ident and oci_log.exists() else "(none)"
            raise AssertionError(f"{self.name} is {status}: state {state}; logs {(logs.stdout + logs.stderr)[-1500:]}; "
                                 f"runtime log {runtime_log}")

    def runtime_used(self) -> str:
        return sh("podman", "inspect", "--format", "{{.OCIRuntime}}", self.name).stdout.strip()

    def remove(self) -> None:
        sh("podman", "rm", "-f", "-t", "0", self.name, check=False)


@pytest.fixture(params=["flag", "default"])
def container(request, delegate):
    """A counter container run through the shim, by --runtime or as podman's default runtime."""
    runtime_flag = ["--runtime", "gpuckpt-runtime"] if request.param == "flag" else []
    if request.param == "default":
        conf = Path("/etc/containers/containers.conf").read_text()
        assert 'runtime = "gpuckpt-runtime"' in conf, "gpuckpt install --engine podman --default did not run"
    box = PodmanContainer(runtime_flag)
    box.run()
    yield box
    box.remove()


def test_run_exec_stop_rm(container) -> None:
    assert container.runtime_used() == "gpuckpt-runtime"
    first = wait_counter(container.state)
    assert_continues(first, container.state)
    sh(*container.podman, "stop", "-t", "1", container.name)
    assert container.status() == "exited"
    sh("podman", "rm", container.name)
    assert sh("podman", "container", "exists", container.name, check=False).returncode == 1


def test_checkpoint_restore_continues(container) -> None:
    before = wait_counter(container.state, minimum=3)
    sh(*container.podman, "container", "checkpoint", container.name)
    assert container.status() == "exited"
    sh(*container.podman, "container", "restore", container.name)
    container.assert_running()
    assert_continues(before, container.state)


@pytest.mark.parametrize("container", ["default"], indirect=True)  # --runtime by name: the two tests above
def test_export_import_leave_running(container, tmp_path) -> None:
    container.remove()
    container.run(LATE_FILES_COUNTER)  # podman copies the files after the processes ran on (docs/archives.md)
    archive = tmp_path / "ckpt.tar.gz"
    before = wait_counter(container.state, minimum=3)
    sh(*container.podman, "container", "checkpoint", "--leave-running", "--export", str(archive), container.name)
    # --leave-running: the same process goes on
    container.assert_running()
    assert_continues(before, container.state)
    container.remove()
    sh(*container.podman, "container", "restore", "--import", str(archive))
    container.assert_running()
    assert_continues(before, container.state)


@pytest.mark.parametrize("container", ["default"], indirect=True)  # --runtime by name: the two tests above
def test_keep_keeps_the_checkpoint_files(container) -> None:
    before = wait_counter(container.state, minimum=3)
    sh(*container.podman, "container", "checkpoint", "--keep", container.name)
    userdata = Path(sh("podman", "inspect", "--format", "{{.StaticDir}}", container.name).stdout.strip())
    assert (userdata / "checkpoint" / "inventory.img").exists()
    sh(*container.podman, "container", "restore", "--keep", container.name)
    assert (userdata / "checkpoint" / "inventory.img").exists()
    assert_continues(before, container.state)


@pytest.fixture
def resident_helper(tmp_path) -> Iterator[tuple[Path, subprocess.Popen]]:
    """gpuckpt-runtimed, installed beside the runtime, listening on /run/gpuckpt/runtime.sock for the test (as
    gpuckpt-runtimed.socket would start it); yields the file its journal lines go to, and the process."""
    helper_program = Path(RUNTIME).with_name("gpuckpt-runtimed")
    assert helper_program.exists(), f"{helper_program}: not installed beside {RUNTIME}"
    journal = tmp_path / "runtimed.log"
    assert not helper_listens(), "a gpuckpt-runtimed already listens: this test starts its own"
    with open(journal, "w") as out:
        helper = subprocess.Popen([str(helper_program)], stderr=out)
    try:
        deadline = time.monotonic() + 30
        while not helper_listens():
            assert helper.poll() is None and time.monotonic() < deadline, journal.read_text()
            time.sleep(0.05)
        yield journal, helper
    finally:
        helper.terminate()
        helper.wait(30)


def test_checkpoint_restore_through_the_resident_helper(delegate, resident_helper) -> None:
    """podman's checkpoint and restore worked by gpuckpt-runtimed's workers: the counter goes on, the helper's
    journal names each verb, and the restored init is conmon's child (the caller ran the delegate, not the
    helper). With the helper stopped the next cycle is worked in the runtime's own process."""
    journal_file, helper = resident_helper
    box = PodmanContainer(["--runtime", "gpuckpt-runtime"])
    box.run()
    try:
        ident = sh("podman", "inspect", "--format", "{{.Id}}", box.name).stdout.strip()
        before = wait_counter(box.state, minimum=3)
        sh(*box.podman, "container", "checkpoint", box.name)
        assert box.status() == "exited"
        sh(*box.podman, "container", "restore", box.name)
        box.assert_running()
        before = assert_continues(before, box.state)
        journal = journal_file.read_text()
        assert re.search(rf"checkpoint {ident} for pid \d+: exit 0", journal), journal
        assert re.search(rf"restore {ident} for pid \d+: exit 0", journal), journal
        init, conmon = sh("podman", "inspect", "--format", "{{.State.Pid}} {{.State.ConmonPid}}", box.name
                          ).stdout.split()
        parent = Path(f"/proc/{init}/stat").read_text().rsplit(")", 1)[1].split()[1]
        assert parent == conmon, f"restored init {init}'s parent is {parent}, conmon is {conmon}"
        helper.terminate()
        helper.wait(30)
        sh(*box.podman, "container", "checkpoint", box.name)
        sh(*box.podman, "container", "restore", box.name)
        box.assert_running()
        assert_continues(before, box.state)
        assert journal_file.read_text() == journal  # the helper was gone: the runtime worked them itself
    finally:
        box.remove()


LOOPBACK_SERVER_SOURCE = (
    "import socket\n"
    "server = socket.socket(); server.bind(('127.0.0.1', 8080)); server.listen()\n"
    "count = 0\n"
    "while True:\n"
    "    peer, _ = server.accept(); count += 1; peer.sendall(b'answer %d' % count); peer.close()\n"
)
ASK_LOOPBACK_SOURCE = (
    "import socket\n"
    "try:\n"
    "    print(socket.create_connection(('127.0.0.1', 8080), timeout=10).recv(64).decode())\n"
    "except OSError as error:\n"
    "    print(error)\n"
)


def test_a_restored_server_answers_on_its_loopback(delegate) -> None:
    """A server on the container's 127.0.0.1 answers after a restore and goes on counting: runc's restore
    leaves the loopback of the network namespace it makes down (crun's does not), the shim sets it up."""
    box = PodmanContainer(["--runtime", "gpuckpt-runtime"])
    sh("podman", "run", "-d", "--name", box.name, "--network", "none", PODMAN_IMAGE, "python3", "-c",
       LOOPBACK_SERVER_SOURCE)
    try:
        def ask() -> str:
            return sh("podman", "exec", box.name, "python3", "-c", ASK_LOOPBACK_SOURCE).stdout.strip()

        for _ in range(50):
            if (first := ask()) == "answer 1":
                break
        assert first == "answer 1", first
        sh("podman", "container", "checkpoint", box.name)
        sh("podman", "container", "restore", box.name)
        box.assert_running()
        assert ask() == "answer 2"  # the same server, its count kept
    finally:
        box.remove()


def test_failed_checkpoint_leaves_container_running(delegate) -> None:
    """CRIU refuses a connection on the container's own loopback without --tcp-established, which
    the default policy does not add for loopback (see policy/network.py): the checkpoint fails,
    says what to enable, and the workload goes on."""
    box = PodmanContainer(["--runtime", "gpuckpt-runtime"])
    try:
        sh(*box.podman, "run", "-d", "--name", box.name, "--network", "none",
           PODMAN_IMAGE, "python3", "-c", TCP_HOLDER_SOURCE + COUNTER_SOURCE)
        before = wait_counter(box.state, minimum=3)
        failed = sh(*box.podman, "container", "checkpoint", box.name, check=False)
        assert failed.returncode != 0
        assert "established TCP connection(s)" in failed.stderr and "--tcp-established" in failed.stderr
        assert box.status() == "running"
        assert_continues(before, box.state)
    finally:
        box.remove()


@pytest.mark.parametrize("opted_in", [False, True])
def test_pause_unpause(delegate, opted_in) -> None:
    """pause/unpause go through the shim (owned for suspend-on-pause): the workload freezes and goes on."""
    box = PodmanContainer(["--runtime", "gpuckpt-runtime"])
    annotation = ["--annotation", "io.gpuckpt.suspend-on-pause=true"] if opted_in else []
    try:
        sh(*box.podman, "run", "-d", "--name", box.name, "--network", "none", *annotation,
           PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
        before = wait_counter(box.state, minimum=3)
        sh(*box.podman, "pause", box.name)
        assert box.status() == "paused"
        sh(*box.podman, "unpause", box.name)
        assert_continues(before, box.state)
    finally:
        box.remove()


def test_runtime_version_names_shim_and_delegate(delegate) -> None:
    output = sh(RUNTIME, "--version").stdout
    assert output.startswith("gpuckpt-runtime version")
    assert f"{delegate} version" in output


def test_container_cannot_point_criu_at_its_own_config(delegate, tmp_path) -> None:
    """runc honours org.criu.config; through the shim the annotation is refused and nothing happens."""
    evil = tmp_path / "evil.conf"
    evil.write_text("leave-running\n")  # harmless here; any CRIU option could stand in this file
    box = PodmanContainer(["--runtime", "gpuckpt-runtime"])
    try:
        sh(*box.podman, "run", "-d", "--name", box.name, "--network", "none",
           "--annotation", f"org.criu.config={evil}", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
        before = wait_counter(box.state, minimum=3)
        refused = sh(*box.podman, "container", "checkpoint", box.name, check=False)
        assert refused.returncode != 0
        assert "a CRIU configuration chosen by the container is refused" in refused.stderr
        assert box.status() == "running"
        assert_continues(before, box.state)
    finally:
        box.remove()


def test_crun_restore_is_refused_while_a_cgroup_hierarchy_is_mounted_nowhere(tmp_path) -> None:
    """crun's restore would kill every process on the node (host/cgroup_v1.py): the shim refuses it with
    one line, the container stays checkpointed, nothing else dies; once the hierarchy is gone it restores. A
    checkpoint whose cgroup image lists a hierarchy the node lacks is refused too."""
    if not hybrid_or_legacy():
        pytest.skip("cgroup v2 host: crun's restore proxy finds its own cgroup there")
    hierarchy = f"name=gpuckpt-stale-{os.getpid()}"
    bystander = subprocess.Popen(["sleep", "300"])  # in the root cgroup, as every process of a node without systemd
    with configured_delegate("crun"):
        box = PodmanContainer(["--runtime", "gpuckpt-runtime"])
        box.run()
        try:
            before = wait_counter(box.state, minimum=3)
            sh(*box.podman, "container", "checkpoint", box.name)
            make_stale_hierarchy(f"none,{hierarchy}")
            try:
                refused = sh(*box.podman, "container", "restore", box.name, check=False)
                assert refused.returncode != 0
                assert f"the cgroup v1 hierarchy '{hierarchy}' is not mounted at" in refused.stderr
                assert box.status() == "exited"
                assert bystander.poll() is None, "a process outside the container was killed"
            finally:
                remove_stale_hierarchy(f"none,{hierarchy}")
            sh(*box.podman, "container", "restore", box.name)
            box.assert_running()
            assert_continues(before, box.state)

            # Dumped while the hierarchy existed, the checkpoint's cgroup image lists it: CRIU would make it
            # again during crun's restore, after any look at /proc/self/cgroup (as it did on the CI machine).
            make_stale_hierarchy(f"none,{hierarchy}")
            try:
                sh(*box.podman, "container", "checkpoint", box.name)
            finally:
                remove_stale_hierarchy(f"none,{hierarchy}")
            refused = sh(*box.podman, "container", "restore", box.name, check=False)
            assert refused.returncode != 0
            assert f"the checkpoint's cgroup image lists the cgroup v1 hierarchy '{hierarchy}'" in refused.stderr
            assert box.status() == "exited" and bystander.poll() is None
            assert f":{hierarchy}:" not in Path("/proc/self/cgroup").read_text()
        finally:
            box.remove()
            bystander.kill()
