"""gpuckpt-hook on a real driver: the container's GPU recorded with NVML's UUID, kept across a checkpoint and
restore, dropped when it goes; a GPU the node lacks refused. Under podman (hooks.d) and docker (added to the spec)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import harness
import pytest
from harness import COUNTER, assert_continues, gpuckpt_python, install_hooks_d, log, wait_counters

pytestmark = pytest.mark.gpu


def inventory_record(container_id: str) -> dict | None:
    path = Path("/run/gpuckpt/containers") / f"{container_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def recorded_gpu_container(engine: harness.Engine, name: str,
                           nvml: dict[int, str]) -> tuple[str, dict, harness.StateDir]:
    """Run the counter on GPU 0 through `engine`; its id, the record the hook wrote (checked
    against the engine's name and NVML's UUID of GPU 0) and its state directory."""
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    engine.import_rootfs()
    engine.run_gpu(name, COUNTER, {"GIB": "1", "STATE": "/state/state"}, state)
    container_id = engine.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
    record = inventory_record(container_id)
    assert record and record["engine"] == type(engine).__name__.lower(), record
    assert [(gpu["minor"], gpu["uuid"]) for gpu in record["gpus"]] == [(0, nvml[0])], (record, nvml)
    return container_id, record, state


def nvml_uuids() -> dict[int, str]:
    code = ("import json; from gpuckpt.cuda.devices import list_gpus; "
            "print(json.dumps({gpu.minor: gpu.uuid for gpu in list_gpus()}))")
    return {int(minor): uuid for minor, uuid in gpuckpt_python(code).items()}


@harness.nftables_network_lock()
def test_hook_podman(results: dict, podman: harness.Podman) -> None:
    """gpuckpt-hook on a real driver under podman (hooks.d): a GPU container recorded with the UUID
    NVML gives its /dev/nvidiaN, kept across a checkpoint and restore (runc runs createRuntime in
    CRIU's setup-namespaces), dropped when the container goes; a container asking for a GPU the
    node lacks refused with the hook's line."""
    nvml = nvml_uuids()
    information = {path.parent.name: path.read_text()
                   for path in Path("/proc/driver/nvidia/gpus").glob("*/information")}
    install_hooks_d()
    found: dict = {"nvml_uuid_by_minor": nvml, "proc_information": information}
    name = f"gpu-hook-{os.getpid()}"
    try:
        container_id, record, state = recorded_gpu_container(podman, name, nvml)
        before = wait_counters(state, 1, 3)
        podman.cli("container", "checkpoint", name)
        podman.cli("container", "restore", name)
        after = assert_continues(state, before)
        restored = inventory_record(container_id)
        assert restored and restored["pid"] != record["pid"] and restored["gpus"] == record["gpus"], restored
        podman.cli("rm", "-f", "-t", "0", name)
        assert inventory_record(container_id) is None
        found["podman"] = {"record": record, "after_restore": restored, "before": before, "after": after}
        missing = max(nvml) + 1
        (harness.WORK / f"nvidia{missing}").unlink(missing_ok=True)
        os.mknod(harness.WORK / f"nvidia{missing}", 0o600 | 0o020000, os.makedev(195, missing))
        refused = podman.cli("run", "-d", "--name", f"{name}-x", "--network", "none", "--device",
                             f"{harness.WORK / f'nvidia{missing}'}:/dev/nvidia{missing}", podman.IMAGE, "true",
                             check=False)
        assert refused.returncode != 0 and f"is given /dev/nvidia{missing} but this node has no such GPU" in \
            refused.stderr, refused.stderr
        found["refused"] = refused.stderr.strip()[-400:]
    finally:
        podman.cli("rm", "-f", "-t", "0", name, f"{name}-x", check=False)
    results["hook_podman"] = found
    log(f"hook under podman: record {found['podman']['record']['gpus']}; refused: {found['refused'][-160:]}")


def test_hook_docker(results: dict, docker: harness.Docker) -> None:
    """gpuckpt-hook under docker, added to the spec by the runtime's create (hook.add_to_spec)."""
    nvml = nvml_uuids()
    found: dict = {}
    name = f"gpu-hook-{os.getpid()}"
    docker.start()
    config = Path("/etc/gpuckpt/config.toml")
    saved = config.read_text()
    config.write_text(saved + "[hook]\nadd_to_spec = true\n")
    try:
        container_id, record, _ = recorded_gpu_container(docker, name, nvml)
        docker.cli("rm", "-f", name)
        assert inventory_record(container_id) is None
        found["docker"] = {"record": record}
    finally:
        config.write_text(saved)
        docker.cli("rm", "-f", name, check=False)
        docker.stop()
    results["hook_docker"] = found
    log(f"hook under docker: record {found['docker']['record']}")
