"""Kubernetes' checkpoint and restore of a CUDA container through the CRI, on the GPU machine (issue #14):
the same calls as integration/test_cri.py, with a GPU workload.

Two private containerd 2.1 nodes (carried by `pack-carry.sh containerd`; cri_node.py) with gpuckpt's handler
registered by `gpuckpt install --engine containerd --config`; images served from an OCI layout on loopback
(the sandbox is Debian's static `catatonit -P`; the workload's image is harness.rootfs_tar(), its userland
bound from the host). The pod's container runs gpu_counter.py (GIB of device data, checksummed every tick);
kubelet's ContainerCheckpoint is CheckpointContainer into an archive (containerd freezes the task, the shim
thaws it for the driver's checkpoint; the container keeps running); the restore is CreateContainer whose
image is the archive, in a new pod on node A, then on node B. Each step asserts the same token, a counter
going on and the device data intact; figures and versions go to OUT_DIR/cri_gpu.json.

Usage (root, repository root, on the GPU machine): python3 integration/gpu/cri_gpu.py OUT_DIR [GIB]
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import time
import traceback
import uuid
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(GPU_DIR), str(GPU_DIR.parent)]
import harness  # noqa: E402
from harness import CARRY, CLI, RUNTIME, WORK, StateDir, assert_continues, log, nvidia_devices, wait_counters  # noqa: E402

FACTS = harness.install()  # the carried runc, CRIU and wheels (grpcio-tools among them) first
sys.path.insert(0, str(harness.SITE))
from cri_node import HANDLER, Node, layout_registry, write_layout  # noqa: E402

CONTAINERD = CARRY / "containerd" / "bin" / "containerd"
CATATONIT = CARRY / "containerd" / "bin" / "catatonit"


def images(layout: Path) -> None:
    """The workload's image (tag `gpu`) and the sandbox's (tag `pause`) in one layout."""
    write_layout(layout, harness.rootfs_tar(), ["/usr/bin/sleep", "infinity"], "gpu")
    pause = WORK / "cri-pause.tar"
    with tarfile.open(pause, "w") as tar:
        tar.add(CATATONIT, arcname="catatonit")
    write_layout(layout, pause, ["/catatonit", "-P"], "pause")


def gpu_container(state: StateDir, gib: str) -> dict:
    """CreateContainer's arguments for gpu_counter.py: the host userland read-only (directory by directory: an
    rbind of /usr would bring /usr/local/nvidia in as a submount, which CRIU refuses), the GPU's device nodes."""
    mounts = [(path, path, True) for path in ("/usr/bin", "/usr/lib", "/usr/lib64", "/usr/share", "/usr/local/nvidia",
                                              "/opt/torch") if os.path.isdir(path)]
    mounts += [(str(GPU_DIR), "/work", True), (str(state.directory), "/state", False)]
    return {"command": ["python3", "/work/gpu_counter.py"], "working_dir": "/work", "mounts": mounts,
            "devices": [rule["path"] for rule in nvidia_devices([0])],
            "envs": {"PATH": "/opt/torch/.venv/bin:/usr/bin:/bin", "HOME": "/root", "PYTHONUNBUFFERED": "1",
                     "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64", "GIB": gib, "STATE": "/state/state"}}


def run_pod(node: Node, image: str, archive: Path | None, container: dict) -> tuple[str, str]:
    """A pod under the gpuckpt handler with the GPU container: started from `image`, or restored from `archive`."""
    kubelet = node.kubelet
    assert kubelet is not None
    config = kubelet.pod_config(f"gpu-cri-{uuid.uuid4().hex[:8]}", str(uuid.uuid4()), node.cgroup_parent)
    pod_id = kubelet.run_pod(config, HANDLER)
    container_id = kubelet.create(pod_id, config, "counter", str(archive) if archive else image, **container)
    kubelet.start(container_id)
    return pod_id, container_id


def scenario(results: dict, gib: str) -> None:
    layout = WORK / "cri-layout"
    images(layout)
    state = StateDir("cri", WORK / "cri-state")
    archive = Path("/var/tmp/gpuckpt-cri-gpu.tar")
    with layout_registry(layout) as registry, harness.nftables_network_lock():
        image = f"{registry}/gpuckpt-gpu:gpu"
        nodes = [Node(name, WORK, f"{registry}/gpuckpt-pause:pause", gpuckpt=CLI, runtime=RUNTIME,
                      containerd=CONTAINERD, snapshotter="native", path_first=(str(CARRY / "bin"),))
                 for name in ("gpu-node-a", "gpu-node-b")]
        try:
            for node in nodes:
                node.install_handler()
                node.start()
            node_a, node_b = nodes
            assert node_a.kubelet is not None and node_b.kubelet is not None
            results["containerd"] = node_a.kubelet.version().runtime_version
            container = gpu_container(state, gib)
            node_a.kubelet.pull(image)
            pod_id, container_id = run_pod(node_a, image, None, container)
            before = wait_counters(state, 1, 3)
            started = time.monotonic()
            node_a.kubelet.checkpoint(container_id, archive, timeout_s=900)
            checkpoint_s = time.monotonic() - started
            live = assert_continues(state, before)  # kubelet's checkpoint leaves the container running
            with tarfile.open(archive) as tar:
                manifest = json.load(tar.extractfile("checkpoint/gpuckpt-manifest.json"))  # type: ignore[arg-type]
            assert manifest["processes"] and manifest["gpu_handler"] == "gpuckpt", manifest
            assert manifest["leave_running"], manifest
            inspected = harness.sh(CLI, "inspect", "--json", str(archive)).stdout
            assert json.loads(inspected)["manifest"]["processes"], inspected
            node_a.kubelet.stop_and_remove_pod(pod_id)
            restores = {}
            for node in (node_a, node_b):  # a new pod on the same node, then on the second node
                assert node.kubelet is not None
                for written in state.directory.glob("state*"):  # only the restored process may write them now
                    written.unlink()
                started = time.monotonic()
                pod_id, container_id = run_pod(node, image, archive, container)
                restore_s = time.monotonic() - started
                after = assert_continues(state, before)
                restores[node.name] = {"restore_s": round(restore_s, 3), "after": after}
                log(f"CRI restore on {node.name}: {restore_s:.2f} s, {before} -> {after}")
                node.kubelet.stop_and_remove_pod(pod_id)
            results["cri_gpu"] = {
                "gib": gib, "checkpoint_s": round(checkpoint_s, 3), "archive_bytes": archive.stat().st_size,
                "before": before, "live_after_checkpoint": live, "restores": restores,
                "manifest_timings": manifest["timings"], "cuda_processes": len(manifest["processes"])}
            log(f"CRI checkpoint {checkpoint_s:.2f} s ({archive.stat().st_size / 2**30:.2f} GiB archive), "
                f"{before} -> {live}")
        finally:
            for node in nodes:
                try:
                    node.stop()
                except Exception as error:
                    log(f"stopping {node.name}: {error}\n{node.log_tail()}")
            archive.unlink(missing_ok=True)


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    harness.OUT = out
    results: dict = {"machine": FACTS["nvidia_smi"], "facts": FACTS, "passed": False}
    try:
        scenario(results, sys.argv[2] if len(sys.argv) > 2 else "1")
        results["passed"] = True
    except Exception as error:
        traceback.print_exc()
        results["error"] = f"{type(error).__name__}: {error}"[-3000:]
    for log_file in WORK.glob("gpu-node-*-containerd.log"):
        (out / log_file.name).write_text(log_file.read_text(errors="replace")[-200_000:])
    (out / "cri_gpu.json").write_text(json.dumps(results, indent=2))
    print("cri_gpu: passed" if results["passed"] else f"cri_gpu: FAILED: {results.get('error')}")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
