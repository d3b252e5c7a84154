"""A CUDA container under docker through gpuckpt-runtime: checkpoint create (containerd freezes it first),
start --checkpoint, --leave-running."""

from __future__ import annotations

import os
import time

import harness
import pytest
from harness import COUNTER, assert_continues, log, manifest, wait_counters

pytestmark = pytest.mark.gpu


@harness.nftables_network_lock()
def test_docker(results: dict, docker: harness.Docker) -> None:
    """`docker checkpoint create` and `docker start --checkpoint` on a CUDA container: containerd
    freezes the container before calling the runtime's checkpoint; the shim thaws it for the GPU
    steps. Also --leave-running. The workload verifies its device data and goes on."""
    driver = docker.start()
    name = f"gpu-docker-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    container_id = ""
    try:
        docker.import_rootfs()
        docker.run_gpu(name, COUNTER, {"GIB": "2", "STATE": "/state/state"}, state)
        container_id = docker.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
        before = wait_counters(state, 1, 3)
        started = time.monotonic()
        docker.cli("checkpoint", "create", name, "cp1")
        checkpoint_s = time.monotonic() - started
        status = docker.cli("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        assert status == "exited", status
        images = harness.Docker.DATA_ROOT / "containers" / container_id / "checkpoints" / "cp1"
        info = manifest(images)
        assert info["processes"] and info["gpu_handler"] == "gpuckpt", info
        started = time.monotonic()
        docker.cli("start", "--checkpoint", "cp1", name)
        restore_s = time.monotonic() - started
        after = assert_continues(state, before)
        # the shim's own share of those (docker packs the image into containerd's content store
        # and out again around it)
        restored_line = next((line for line in docker.runtime_log(container_id).splitlines()
                              if "restored" in line and "total_s" in line), "")
        started = time.monotonic()
        docker.cli("checkpoint", "create", "--leave-running", name, "cp2")
        live_s = time.monotonic() - started
        live = assert_continues(state, after)
        # containerd pauses every task it checkpoints; its bundle (and the runtime's log) outlives
        # only a --leave-running checkpoint
        runtime_log = docker.runtime_log(container_id)
        assert "frozen by the engine" in runtime_log, runtime_log[-2000:]
        downtime = manifest(images.parent / "cp2")["timings"]["downtime_s"]
        results["docker"] = {"storage_driver": driver, "checkpoint_s": round(checkpoint_s, 3),
                             "restore_s": round(restore_s, 3), "leave_running_checkpoint_s": round(live_s, 3),
                             "leave_running_downtime_s": round(downtime, 3), "before": before, "after": after,
                             "after_leave_running": live, "manifest_timings": info["timings"],
                             "shim_restore_phases": restored_line}
        log(f"docker: checkpoint {checkpoint_s:.2f} s (frozen by containerd, thawed for the GPU steps), "
            f"start --checkpoint {restore_s:.2f} s, {before} -> {after}; --leave-running downtime {downtime:.2f} s -> "
            f"{live}; "
            f"the shim's checkpoint phases {info['timings']}; its restore: {restored_line}")
    except Exception:
        if container_id:
            docker.keep_logs(container_id)
            results["docker_runtime_log"] = docker.runtime_log(container_id)[-12000:]
        raise
    finally:
        docker.cli("rm", "-f", name, check=False)
        docker.stop()
