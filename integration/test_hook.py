"""gpuckpt-hook under the real engines: podman through hooks.d, docker through the runtime's create.

A GPU here is a character device 195:N made in a temporary directory and given to the container
(`--device`); the hooks.d files the tests write point the hook at a /proc/driver/nvidia tree of
their own, so the GPU the node "has" is that tree's. The hooks.d files `gpuckpt install` wrote
are checked as the node has them.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
from bed import DOCKER, DOCKER_IMAGE, PODMAN_IMAGE, RUNTIME, configured_delegate, sh

from gpuckpt.node.container_record import parse_record
from gpuckpt.node.hooks_d import hooks_d_file, hooks_d_files

pytestmark = pytest.mark.integration
UUID0 = "GPU-0badc0de-0000-4000-8000-000000000000"
HOOK = str(Path(RUNTIME).parent / "gpuckpt-hook")
NODE_HAS_NVIDIA_DRIVER = os.path.isdir("/proc/driver/nvidia/gpus")
_names = itertools.count()


@pytest.fixture
def fake_node(tmp_path: Path) -> Path:
    """Device nodes /dev/nvidia0 and 1 to give containers, a driver tree listing only GPU 0, and
    hooks.d files running the installed hook against that tree and a state directory of the test's."""
    for minor in (0, 1):
        os.mknod(tmp_path / f"nvidia{minor}", 0o600 | 0o020000, os.makedev(195, minor))
    information = tmp_path / "proc" / "gpus" / "0000:01:00.0" / "information"
    information.parent.mkdir(parents=True)
    information.write_text(f"Model: \t\t NVIDIA H100\nGPU UUID: \t {UUID0}\nDevice Minor: \t 0\n")
    (tmp_path / "hooks.d").mkdir()
    env = [f"GPUCKPT_STATE_DIR={tmp_path / 'state'}", f"GPUCKPT_NVIDIA_PROC={tmp_path / 'proc'}"]
    for stage in ("createRuntime", "poststop"):
        (tmp_path / "hooks.d" / f"{stage}.json").write_text(hooks_d_file(HOOK, stage, env).model_dump_json())
    return tmp_path


def podman(node: Path, *argv: str, check: bool = True):
    return sh("podman", "--hooks-dir", str(node / "hooks.d"), *argv, check=check)


def inventory(node: Path) -> dict[str, object]:
    directory = node / "state" / "containers"
    return {path.stem: parse_record(path.read_bytes(), str(path)) for path in directory.glob("*.json")}


def test_install_registered_the_hook_with_podman() -> None:
    for name, text in hooks_d_files(HOOK).items():
        assert Path("/etc/containers/oci/hooks.d", name).read_text() == text


def test_podman_gpu_container_is_recorded_until_it_is_removed(delegate, fake_node) -> None:
    name = f"gpuckpt-hook-{os.getpid()}-{next(_names)}"
    podman(fake_node, "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name,
           "--device", f"{fake_node / 'nvidia0'}:/dev/nvidia0", PODMAN_IMAGE, "sleep", "600")
    try:
        container_id = sh("podman", "inspect", "--format", "{{.Id}}", name).stdout.strip()
        record = inventory(fake_node)[container_id]
        assert (record.engine, [(gpu.minor, gpu.uuid) for gpu in record.gpus]) == ("podman", [(0, UUID0)])
        assert record.pid == int(sh("podman", "inspect", "--format", "{{.State.Pid}}", name).stdout)
    finally:
        podman(fake_node, "rm", "-f", "-t", "0", name)
    assert inventory(fake_node) == {}


def test_podman_cpu_container_leaves_no_record(delegate, fake_node) -> None:
    name = f"gpuckpt-hook-{os.getpid()}-{next(_names)}"
    result = podman(fake_node, "run", "--rm", "--runtime", "gpuckpt-runtime", "--name", name, PODMAN_IMAGE,
                    "echo", "ran")
    assert result.stdout.strip() == "ran"
    assert not (fake_node / "state" / "containers").exists() or inventory(fake_node) == {}


def test_podman_container_given_a_gpu_the_node_lacks_is_refused(delegate, fake_node) -> None:
    name = f"gpuckpt-hook-{os.getpid()}-{next(_names)}"
    result = podman(fake_node, "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name,
                    "--device", f"{fake_node / 'nvidia1'}:/dev/nvidia1", PODMAN_IMAGE, "sleep", "600", check=False)
    try:
        assert result.returncode != 0
        if delegate == "runc":  # runc quotes the hook's stderr; crun 1.21 names the hook and its status only
            assert "is given /dev/nvidia1 but this node has no such GPU (GPUs here: /dev/nvidia0)" in result.stderr
        else:
            assert f"error executing hook `{HOOK}` (exit code: 1)" in result.stderr
        status = sh("podman", "inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        assert status != "running" and inventory(fake_node) == {}
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


@pytest.mark.skipif(NODE_HAS_NVIDIA_DRIVER, reason="this node has an NVIDIA driver: the refusal needs a node without")
def test_docker_gets_the_hook_from_the_runtimes_create(fake_node) -> None:
    """docker reads no hooks.d: with hook.add_to_spec on, create adds the hook, and on this GPU-less
    node the hook refuses the container that asks for /dev/nvidia0; a CPU container runs as before."""
    name = f"gpuckpt-hook-{os.getpid()}-{next(_names)}"
    with configured_delegate("runc", "[hook]\nadd_to_spec = true\n"):
        result = sh(DOCKER, "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
                    "--device", f"{fake_node / 'nvidia0'}:/dev/nvidia0", DOCKER_IMAGE, "sleep", "600", check=False)
        try:
            assert result.returncode != 0
            assert "gpuckpt-hook: container" in result.stderr and "this node has no NVIDIA GPU" in result.stderr
        finally:
            sh(DOCKER, "rm", "-f", name, check=False)
        cpu = sh(DOCKER, "run", "--rm", "--runtime", "gpuckpt-runtime", "--network", "none", DOCKER_IMAGE,
                 "python3", "-c", "print('ran')")
        assert cpu.stdout.strip() == "ran"


def test_docker_spec_untouched_with_the_hook_off(fake_node) -> None:
    name = f"gpuckpt-hook-{os.getpid()}-{next(_names)}"
    with configured_delegate("runc"):
        sh(DOCKER, "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
           "--device", f"{fake_node / 'nvidia0'}:/dev/nvidia0", DOCKER_IMAGE, "sleep", "600")
        try:
            container_id = sh(DOCKER, "inspect", "--format", "{{.Id}}", name).stdout.strip()
            # dockerd's own containerd (Debian's docker.io) or a system one
            bundles = [Path(root, "io.containerd.runtime.v2.task", "moby", container_id)
                       for root in ("/run/docker/containerd/daemon", "/run/containerd")]
            spec = json.loads(next(path for path in bundles if path.is_dir()).joinpath("config.json").read_text())
            assert "gpuckpt-hook" not in json.dumps(spec.get("hooks", {}))
        finally:
            sh(DOCKER, "rm", "-f", name)
