"""docker 28 (Debian forky's docker.io 28.5 + containerd 2.1) through gpuckpt-runtime, in the forky root: inside.sh
registers the runtime with `gpuckpt install --engine docker` and starts the root's own dockerd (dockerd.sh).

What docker 28 restores, through the shim, with the data verified: containers on the host's network
(`--network host`), and containers created with networking disabled (the Engine API's `NetworkDisabled`, docker-py's
`network_disabled=True`: a namespace of their own with loopback only, what `--network none` gives), CDI devices
included. What docker 28 itself breaks is shown with plain runc beside the shim, so that each test turns red the day
docker fixes it: a container with a network namespace docker sets up (`--network none`, a bridge) is never restored
(moby runs its network set-up with the restored task's PID before the runtime's restore, and that PID is 0:
containerd#12141), and `docker start --checkpoint-dir` refuses ("custom checkpointdir is not supported")."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from bed import COUNTER_SOURCE, DOCKER, ROOTFS_TAR, RUNTIME, assert_continues, sh, start_from_checkpoint, wait_counter

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU_DIR))
import cdi  # noqa: E402  (the test bed's CDI spec writer, by path: integration/gpu is not part of the package)
from test_cdi_spec import VERSION, fake_driver  # noqa: E402  (the fake driver tree the podman CDI tests use)

IMAGE = "gpuckpt-test:latest"
SOCKET = "/run/docker.sock"
DAEMON_JSON = Path("/etc/docker/daemon.json")
OWN_NETNS_BUG = "bind-mount /proc/0/ns/net"  # containerd#12141 (moby's SetKey with the unstarted task's PID 0)
_names = itertools.count()


def _in_forky() -> bool:
    try:
        return "VERSION_CODENAME=forky" in Path("/etc/os-release").read_text()
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _in_forky(), reason="docker 28 runs in the forky root only "
                                "(integration/forky/run.sh); this machine's docker is tested by test_docker.py")


@pytest.fixture(scope="module", autouse=True)
def docker_image() -> str:
    """The test image in the root's docker (kept between runs with its data root)."""
    if sh(DOCKER, "image", "inspect", IMAGE, check=False).returncode != 0:
        sh(DOCKER, "import", "--change", 'CMD ["/bin/sh"]', ROOTFS_TAR, IMAGE)
    return IMAGE


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Container names of this test's own; each removed afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        sh(DOCKER, "rm", "-f", name, check=False)


def new_name(names: list[str], what: str) -> str:
    names.append(f"gpuckpt-docker28-{what}-{os.getpid()}-{next(_names)}")
    return names[-1]


def state_reader(name: str):
    return lambda: sh(DOCKER, "exec", name, "cat", "/tmp/state").stdout


def run_counter(name: str, runtime: str, *args: str) -> None:
    sh(DOCKER, "run", "-d", "--runtime", runtime, "--name", name, *args, IMAGE, "python3", "-c", COUNTER_SOURCE)


def status(name: str) -> str:
    return sh(DOCKER, "inspect", "--format", "{{.State.Status}}", name).stdout.strip()


class EngineAPI(http.client.HTTPConnection):
    """dockerd's Engine API on the root's socket: what docker-py and other SDKs talk to."""

    def __init__(self) -> None:
        super().__init__("docker")

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(SOCKET)

    def create(self, name: str, body: dict) -> str:
        self.request("POST", f"/containers/create?name={name}", json.dumps(body), {"Content-Type": "application/json"})
        response = self.getresponse()
        answer = response.read().decode()
        assert response.status == 201, f"container create answered {response.status}: {answer}"
        return json.loads(answer)["Id"]


def test_runtime_is_registered_with_docker_28() -> None:
    """`gpuckpt install --engine docker` (inside.sh) wrote daemon.json as dockerd 28 accepts it: the runtime loaded,
    experimental on for `docker checkpoint`, the versions the docs name."""
    assert json.loads(DAEMON_JSON.read_text())["runtimes"]["gpuckpt-runtime"]["path"] == RUNTIME
    loaded = json.loads(sh(DOCKER, "info", "--format", "{{json .Runtimes}}").stdout)
    assert loaded.get("gpuckpt-runtime", {}).get("path") == RUNTIME, loaded
    server = json.loads(sh(DOCKER, "version", "--format", "{{json .Server}}").stdout)
    assert server["Version"].startswith("28."), server["Version"]
    assert server["Experimental"] is True
    containerd = next(c["Version"] for c in server["Components"] if c["Name"] == "containerd")
    assert containerd.startswith("2."), containerd


def test_host_network_checkpoint_restore_and_leave_running(names: list[str]) -> None:
    """A `--network host` container through the shim: checkpoint (it exits), start from it (the same workload goes
    on), then a --leave-running checkpoint, a stop, and a start from that one."""
    name = new_name(names, "host")
    run_counter(name, "gpuckpt-runtime", "--network", "host")
    read_state = state_reader(name)
    before = wait_counter(read_state, minimum=3)
    sh(DOCKER, "checkpoint", "create", name, "cp1")
    assert status(name) == "exited"
    started = start_from_checkpoint(name, "cp1")
    assert started.returncode == 0, started.stderr
    before = assert_continues(before, read_state)
    sh(DOCKER, "checkpoint", "create", "--leave-running", name, "cp-live")
    at_checkpoint = assert_continues(before, read_state)
    sh(DOCKER, "stop", "-t", "1", name)
    assert status(name) == "exited"
    started = start_from_checkpoint(name, "cp-live")
    assert started.returncode == 0, started.stderr
    assert_continues(at_checkpoint, read_state)


@pytest.mark.parametrize("runtime", ["runc", "gpuckpt-runtime"])
def test_network_disabled_container_restores(names: list[str], runtime: str) -> None:
    """The isolated container docker 28 can restore: created with NetworkDisabled (no docker network set-up, so
    none to redo at the restore), it has a network namespace of its own with loopback only; plain runc beside."""
    name = new_name(names, "nonet")
    EngineAPI().create(name, {"Image": IMAGE, "Cmd": ["python3", "-c", COUNTER_SOURCE], "NetworkDisabled": True,
                              "HostConfig": {"Runtime": runtime}})
    sh(DOCKER, "start", name)
    read_state = state_reader(name)
    before = wait_counter(read_state, minimum=3)
    links = sh(DOCKER, "exec", name, "ls", "/sys/class/net").stdout.split()
    assert links == ["lo"], links
    sh(DOCKER, "checkpoint", "create", name, "cp1")
    assert status(name) == "exited"
    started = start_from_checkpoint(name, "cp1")
    assert started.returncode == 0, started.stderr
    assert_continues(before, read_state)
    assert sh(DOCKER, "exec", name, "ls", "/sys/class/net").stdout.split() == ["lo"]


@pytest.mark.parametrize("runtime", ["runc", "gpuckpt-runtime"])
@pytest.mark.parametrize("network", ["none", "bridge"])
def test_docker_network_namespace_is_not_restored_for_any_runtime(names: list[str], network: str,
                                                                  runtime: str) -> None:
    """docker 28's own failure, the same with plain runc: the checkpoint is made, but `docker start --checkpoint`
    of a container whose network namespace docker sets up fails before the runtime's restore is called
    (containerd#12141). The day it passes, docker fixed it: move the case into the supported set."""
    name = new_name(names, network)
    run_counter(name, runtime, "--network", network)
    wait_counter(state_reader(name), minimum=3)
    sh(DOCKER, "checkpoint", "create", name, "cp1")
    assert status(name) == "exited"
    assert "cp1" in sh(DOCKER, "checkpoint", "ls", name).stdout.split()
    started = start_from_checkpoint(name, "cp1")
    if started.returncode == 0:
        pytest.fail(f"docker restored a --network {network} container with {runtime}: containerd#12141 is fixed in "
                    f"this docker; drop this test and support the case (docs/node.md, docker 28)")
    assert OWN_NETNS_BUG in started.stderr and "no such file or directory" in started.stderr, started.stderr
    assert status(name) != "running"


@pytest.mark.parametrize("runtime", ["runc", "gpuckpt-runtime"])
def test_checkpoint_dir_restore_is_refused_for_any_runtime(names: list[str], runtime: str, tmp_path: Path) -> None:
    """`docker checkpoint create --checkpoint-dir` writes there, but `docker start --checkpoint-dir` refuses, with
    plain runc the same (moby: "custom checkpointdir is not supported"); a checkpoint in docker's own store is the
    one to start from."""
    name = new_name(names, "dir")
    run_counter(name, runtime, "--network", "host")
    wait_counter(state_reader(name), minimum=3)
    sh(DOCKER, "checkpoint", "create", "--leave-running", "--checkpoint-dir", str(tmp_path), name, "cp-dir")
    assert (tmp_path / "cp-dir").is_dir()
    sh(DOCKER, "stop", "-t", "1", name)
    refused = sh(DOCKER, "start", "--checkpoint-dir", str(tmp_path), "--checkpoint", "cp-dir", name, check=False)
    if refused.returncode == 0:
        pytest.fail(f"docker started from --checkpoint-dir with {runtime}: docker supports it now; drop this test")
    assert "custom checkpointdir is not supported" in refused.stderr, refused.stderr
    assert status(name) == "exited"


@pytest.fixture
def cdi_kind(tmp_path: Path) -> Iterator[str]:
    """A CDI spec in /etc/cdi (docker 28 reads it there) for a fake driver (test_cdi_spec's: files named as a real
    driver names them, device nodes with /dev/null's numbers), under a kind of this test's own; the GPU nodes'
    container paths renamed (gpuckpt-hook refuses /dev/nvidiaN without a driver loaded)."""
    root = tmp_path / "node"
    fake_driver(root)
    kind = f"gpuckpt-docker28-{os.getpid()}.example.com/gpu"
    hook = cdi.write_hook_launcher(tmp_path / "gpuckpt-cdi-hook", sys.executable)
    spec = cdi.build_spec(cdi.discover(root), str(hook))
    spec["kind"] = kind
    for edits in [spec["containerEdits"], *(device["containerEdits"] for device in spec["devices"])]:
        for node in edits.get("deviceNodes", []):
            node["path"] = node["path"].replace("/dev/nvidia", "/dev/fake-nvidia")
    path = cdi.write_spec(spec, Path(f"/etc/cdi/gpuckpt-docker28-{os.getpid()}.yaml"))
    try:
        yield kind
    finally:
        path.unlink()


def test_cdi_device_checkpoint_and_restore(names: list[str], cdi_kind: str) -> None:
    """`docker run --device KIND=0` with the spec in /etc/cdi, through the shim: the device nodes, the driver files
    bind-mounted at their host paths and the hook's links are there; checkpointed and started from the checkpoint,
    the same workload goes on and the restored container has the same driver view (mounts made again, the links in
    its own layer)."""
    name = new_name(names, "cdi")
    run_counter(name, "gpuckpt-runtime", "--network", "host", "--device", f"{cdi_kind}=0")
    read_state = state_reader(name)
    view = ("import os; lib = '/usr/local/nvidia/lib64'; "
            "print(sorted(n for n in os.listdir('/dev') if n.startswith('fake-nvidia'))); "
            "print(os.readlink(lib + '/libcuda.so.1'), open(lib + '/libcuda.so.1').read().strip()); "
            # the spec's env is the container process's (docker exec gets docker's own env, not the spec's)
            "print([e for e in open('/proc/1/environ').read().split(chr(0)) if e.startswith('NVIDIA_VISIBLE')])")
    expected = ["['fake-nvidia-uvm', 'fake-nvidia-uvm-tools', 'fake-nvidia0', 'fake-nvidiactl']",
                f"libcuda.so.{VERSION} fake libcuda {VERSION}", "['NVIDIA_VISIBLE_DEVICES=void']"]
    before = wait_counter(read_state, minimum=3)
    assert sh(DOCKER, "exec", name, "python3", "-c", view).stdout.splitlines() == expected
    sh(DOCKER, "checkpoint", "create", name, "cp1")
    assert status(name) == "exited"
    started = start_from_checkpoint(name, "cp1")
    assert started.returncode == 0, started.stderr
    assert_continues(before, read_state)
    assert sh(DOCKER, "exec", name, "python3", "-c", view).stdout.splitlines() == expected
