"""A CUDA container under docker 28 (Debian forky's docker.io 28.5 + containerd 2.1) through gpuckpt-runtime, as users
start one: `docker run --device nvidia.com/gpu=0` with the node's CDI spec (cdi.py, in /etc/cdi) and the
self-contained image (image.py), on the host's network (docker 28 restores no container whose network namespace it
sets up: containerd#12141, docs/node.md). Checkpoint create, start --checkpoint, --leave-running and a start from
that checkpoint, the workload's device data verified after each."""

from __future__ import annotations

import os
import time

import harness
import pytest
from harness import COUNTER, assert_continues, log, manifest, wait_counters

pytestmark = pytest.mark.gpu


def start_from_checkpoint(docker: harness.Docker28, name: str, checkpoint: str) -> float:
    """`docker start --checkpoint`, tried again while dockerd's upload of the checkpoint finds the blob in
    containerd's content store already (moby#42900: CRIU's own docker tests retry it too); seconds it took."""
    started = time.monotonic()
    for _ in range(5):
        result = docker.cli("start", "--checkpoint", checkpoint, name, check=False)
        if result.returncode == 0:
            return time.monotonic() - started
        if "already exists" not in result.stderr:
            break
        time.sleep(1)
    raise AssertionError(f"docker start --checkpoint {checkpoint} {name}: {result.stderr.strip()}")


@harness.nftables_network_lock()
def test_docker28_cdi(results: dict, docker28: harness.Docker28) -> None:
    """docker 28 + CDI + the self-contained image: checkpoint (the container exits), start from it, a
    --leave-running checkpoint (it goes on), stop, start from that one; the counter's device data verified each
    time, and the restored container still sees the spec's driver files."""
    driver = docker28.start()
    name = f"gpu-docker28-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    container_id = ""
    try:
        log("docker 28: importing the self-contained image")  # each step logged: an earlier run hung unseen
        imported = docker28.import_rootfs()
        log(f"docker 28: image {imported}; starting {name}")
        docker28.run_gpu(name, COUNTER, {"GIB": "2", "STATE": "/state/state"}, state)
        container_id = docker28.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
        # the self-contained image has python but no grep: the count of libcuda files the CDI spec mounted
        driver_files = ("import glob; print(len(glob.glob('/usr/lib/x86_64-linux-gnu/libcuda.so*') + "
                        "glob.glob('/usr/local/nvidia/lib64/libcuda.so*')))")
        libcuda_before = docker28.cli("exec", name, "python3", "-c", driver_files).stdout.strip()
        before = wait_counters(state, 1, 3)
        log(f"docker 28: counting {before}; checkpoint create")
        started = time.monotonic()
        docker28.cli("checkpoint", "create", name, "cp1")
        checkpoint_s = time.monotonic() - started
        status = docker28.cli("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        assert status == "exited", status
        images = harness.Docker28.DATA_ROOT / "containers" / container_id / "checkpoints" / "cp1"
        info = manifest(images)
        assert info["processes"] and info["gpu_handler"] == "gpuckpt", info
        log(f"docker 28: checkpointed in {checkpoint_s:.2f} s; start --checkpoint")
        restore_s = start_from_checkpoint(docker28, name, "cp1")
        after = assert_continues(state, before)
        assert docker28.cli("exec", name, "python3", "-c", driver_files).stdout.strip() == libcuda_before
        started = time.monotonic()
        docker28.cli("checkpoint", "create", "--leave-running", name, "cp2")
        live_s = time.monotonic() - started
        live = assert_continues(state, after)
        docker28.cli("stop", "-t", "5", name)
        restore_live_s = start_from_checkpoint(docker28, name, "cp2")
        again = assert_continues(state, live)
        results["docker28_cdi"] = {
            "docker": docker28.cli("version", "--format", "{{.Server.Version}}").stdout.strip(),
            "storage_driver": driver, "image": imported, "checkpoint_s": round(checkpoint_s, 3),
            "restore_s": round(restore_s, 3), "leave_running_checkpoint_s": round(live_s, 3),
            "restore_from_leave_running_s": round(restore_live_s, 3),
            "leave_running_downtime_s": round(manifest(images.parent / "cp2")["timings"]["downtime_s"], 3),
            "before": before, "after": after, "after_leave_running": live, "after_second_restore": again,
            "manifest_timings": info["timings"]}
        log(f"docker 28 + CDI: checkpoint {checkpoint_s:.2f} s, start --checkpoint {restore_s:.2f} s, {before} -> "
            f"{after}; --leave-running {live_s:.2f} s -> {live}; stop + start from it {restore_live_s:.2f} s -> "
            f"{again}")
    except Exception:
        if container_id:
            docker28.keep_logs(container_id)
            results["docker28_runtime_log"] = docker28.runtime_log(container_id)[-12000:]
        raise
    finally:
        docker28.cli("rm", "-f", name, check=False)
        docker28.stop()
