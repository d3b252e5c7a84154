"""Kubernetes' checkpoint and restore of a CUDA container through the CRI, on the GPU machine (issues 14 and 32):
the same calls as integration/test_cri.py, with a GPU workload.

Two private containerd 2.1 nodes (carried by `pack-carry.sh containerd`; cri_node.py) with gpuckpt's handler
registered by `gpuckpt install --engine containerd --config`; images served from an OCI layout on loopback (the
sandbox is Debian's static `catatonit -P`). How the GPU reaches the container follows harness.INJECT:
  binds  the image is harness.rootfs_tar(), its userland bound from the host, the GPU's device nodes given as
         ContainerConfig.devices;
  cdi    the image is image.py's self-contained root (its own Python, torch and CUDA runtime), streamed into the
         layout's one layer; the nodes read /etc/cdi (the spec cdi.py writes from this node's driver) and the
         container asks for `nvidia.com/gpu=0` in ContainerConfig.CDI_devices, as a device plugin in CDI mode hands
         it to kubelet: the driver comes from the spec alone.
The pod's container runs gpu_counter.py (GIB of device data, checksummed every tick); kubelet's ContainerCheckpoint
is CheckpointContainer into an archive (containerd freezes the task, the shim thaws it for the driver's checkpoint;
the container keeps running); the restore is CreateContainer whose image is the archive (repeating the devices),
in a new pod on node A, then on node B, which pulls the base image itself. Each step asserts the same token, a
counter going on and the device data intact (in CDI mode also the spec's edits in the container's OCI spec);
figures and versions go to the results.

Usage (root, repository root, on the GPU machine): python3 integration/gpu/cri_gpu.py OUT_DIR [GIB] [--inject cdi]
The pytest form (results as the other GPU scenarios write them): integration/gpu/test_cri_gpu.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import time
import traceback
import uuid
from pathlib import Path
from types import ModuleType

GPU_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(GPU_DIR), str(GPU_DIR.parent)]
import harness  # noqa: E402
from harness import CARRY, CLI, RUNTIME, WORK, StateDir, assert_continues, log, nvidia_devices, wait_counters  # noqa: E402

CONTAINERD = CARRY / "containerd" / "bin" / "containerd"
CATATONIT = CARRY / "containerd" / "bin" / "catatonit"
CDI_DEVICE = "nvidia.com/gpu=0"
LAYOUT_NAME = "gpuckpt-cri-layout"  # the image's layout: a layer of GBs, written once
ARCHIVE = Path("/var/tmp/gpuckpt-cri-gpu.tar")
HOST_USERLAND = ("/usr", "/usr/bin", "/usr/lib", "/usr/lib64", "/usr/share", "/usr/local/nvidia", "/opt/torch")


def cri_node() -> ModuleType:
    """cri_node (and cri_client), importable once harness.install() has put the carried grpcio on SITE."""
    if harness.SITE.is_dir() and str(harness.SITE) not in sys.path:  # (CI's venv has grpcio-tools itself)
        sys.path.insert(0, str(harness.SITE))
    import cri_node as module

    return module


def images(layout: Path) -> dict:
    """The workload's image (tag `gpu`) and the sandbox's (tag `pause`) in one layout; what the layer took."""
    write_layout = cri_node().write_layout
    harness.sh("rm", "-rf", str(layout))  # a warm machine's last call may have left one behind (GBs)
    started = time.monotonic()
    if harness.INJECT == "cdi":
        import image

        write_layout(layout, harness.IMAGE_ROOT, ["/usr/bin/sleep", "infinity"], "gpu", exclude=(image.STAMP,))
    else:
        write_layout(layout, harness.rootfs_tar(), ["/usr/bin/sleep", "infinity"], "gpu")
    layout_s = time.monotonic() - started
    layer_bytes = sum(path.stat().st_size for path in (layout / "blobs" / "sha256").iterdir())
    pause = WORK / "cri-pause.tar"
    with tarfile.open(pause, "w") as tar:
        tar.add(CATATONIT, arcname="catatonit")
    write_layout(layout, pause, ["/catatonit", "-P"], "pause")
    return {"image": "self-contained (image.py)" if harness.INJECT == "cdi" else "host userland bound",
            "layout_bytes": layer_bytes, "layout_s": round(layout_s, 1)}


def gpu_container(state_dir: Path, gib: str) -> dict:
    """CreateContainer's arguments for gpu_counter.py. CDI: the device by its CDI name, nothing of the host but the
    scenario's folder and the state folder. Binds: the host userland read-only (directory by directory: an rbind
    of /usr would bring /usr/local/nvidia in as a submount, which CRIU refuses) and the GPU's device nodes."""
    envs = {**harness.container_env(), "GIB": gib, "STATE": "/state/state"}
    mounts = [(str(GPU_DIR), "/work", True), (str(state_dir), "/state", False)]
    if harness.INJECT == "cdi":
        return {"command": harness.COUNTER, "working_dir": "/work", "mounts": mounts, "envs": envs,
                "cdi_devices": [CDI_DEVICE]}
    userland = [(path, path, True) for path in HOST_USERLAND[1:] if os.path.isdir(path)]
    return {"command": harness.COUNTER, "working_dir": "/work", "mounts": userland + mounts, "envs": envs,
            "devices": [rule["path"] for rule in nvidia_devices([0])]}


def cdi_edits(runtime_spec: dict, spec: dict, gpu_node: str = "/dev/nvidia0") -> dict:
    """What the node's CDI spec put into a container's OCI spec (containerd's verbose status): every driver file it
    binds, the GPU's (`gpu_node`) and the control device nodes, its env; and no host userland bound in."""
    destinations = {mount["destination"] for mount in runtime_spec.get("mounts", [])}
    prefix = gpu_node.rstrip("0123456789")
    devices = sorted(d["path"] for d in runtime_spec.get("linux", {}).get("devices", [])
                     if d["path"].startswith(prefix))
    found = {"devices": devices,
             "driver_files_missing": sorted({m["containerPath"] for m in spec["containerEdits"]["mounts"]}
                                            - destinations),
             "host_userland_bound": sorted(destinations & set(HOST_USERLAND)),
             "env": sorted(e for e in runtime_spec.get("process", {}).get("env", []) if e.startswith("NVIDIA_")),
             "hooks": [hook["args"][1] for hook in runtime_spec.get("hooks", {}).get("createContainer", [])]}
    assert not found["driver_files_missing"] and not found["host_userland_bound"], found
    assert gpu_node in devices and "NVIDIA_VISIBLE_DEVICES=void" in found["env"], found
    return found


def snapshotter() -> str:
    """overlayfs where an overlay mounts below the nodes' root (/var/lib/gpuckpt-cri), as podman's overlay driver
    does on the GPU machine: a container's root is then no copy of the image's GBs; else native (a copy each)."""
    probe = Path("/var/lib/gpuckpt-cri") / f"overlay-probe-{os.getpid()}"
    for sub in ("lower", "upper", "work", "merged"):
        (probe / sub).mkdir(parents=True, exist_ok=True)
    try:
        mounted = harness.sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={probe / 'lower'},upperdir="
                             f"{probe / 'upper'},workdir={probe / 'work'}", str(probe / "merged"), check=False)
        if mounted.returncode == 0:
            harness.sh("umount", str(probe / "merged"), check=False)
        return "overlayfs" if mounted.returncode == 0 else "native"
    finally:
        harness.sh("rm", "-rf", str(probe), check=False)


def layout_dir() -> Path:
    """Where the layout goes: /dev/shm where it has room for the image twice over and the workloads' own (the
    GPU machine's disk, 64 GiB, holds the torch venv, both nodes' unpacked images and the checkpoint), else
    /var/tmp."""
    import image

    stamp, size = harness.IMAGE_ROOT / image.STAMP, 0
    if harness.INJECT == "cdi" and stamp.is_file():
        size = json.loads(stamp.read_text()).get("bytes", 0)
    room = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    return Path("/dev/shm" if room > 2 * size + (8 << 30) else "/var/tmp") / LAYOUT_NAME


def free_gib() -> dict:
    """Free space where the nodes, the archive and the layout live (GiB)."""
    places = {"var_lib": "/var/lib", "var_tmp": "/var/tmp", "dev_shm": "/dev/shm"}
    return {name: round(shutil.disk_usage(path).free / 2**30, 1) for name, path in places.items()
            if os.path.isdir(path)}


def run_pod(node, image: str, archive: Path | None, container: dict) -> tuple[str, str]:
    """A pod under the gpuckpt handler with the GPU container: started from `image`, or restored from `archive`."""
    kubelet = node.kubelet
    assert kubelet is not None
    config = kubelet.pod_config(f"gpu-cri-{uuid.uuid4().hex[:8]}", str(uuid.uuid4()), node.cgroup_parent)
    pod_id = kubelet.run_pod(config, cri_node().HANDLER)
    container_id = kubelet.create(pod_id, config, "counter", str(archive) if archive else image, **container)
    kubelet.start(container_id)
    return pod_id, container_id


def scenario(results: dict, gib: str) -> None:
    """Checkpoint on node A (left running), restore in a new pod on node A and on node B; figures into `results`."""
    cri = cri_node()
    results["inject"] = harness.INJECT
    layout = layout_dir()
    results["images"] = {**images(layout), "layout": str(layout)}
    results["free_gib"] = {"start": free_gib()}
    state = StateDir("cri", WORK / "cri-state")
    spec = harness.cdi_spec() if harness.INJECT == "cdi" else None
    cdi_dirs = (str(harness.CDI_SPEC.parent),) if spec is not None else ()
    # the binds image is tiny and native ran there; the self-contained one is GBs: no copy per container
    results["snapshotter"] = snapshotter() if spec is not None else "native"
    with cri.layout_registry(layout) as registry, harness.nftables_network_lock():
        image = f"{registry}/gpuckpt-gpu:gpu"
        nodes = [cri.Node(name, WORK, f"{registry}/gpuckpt-pause:pause", gpuckpt=CLI, runtime=RUNTIME,
                          containerd=CONTAINERD, snapshotter=results["snapshotter"], path_first=(str(CARRY / "bin"),),
                          cdi_spec_dirs=cdi_dirs, discard_unpacked_layers=True)
                 for name in ("gpu-node-a", "gpu-node-b")]
        try:
            for node in nodes:
                node.install_handler()
                node.start()
                node.kubelet.timeout_s = 540  # a restore on node B pulls and unpacks the image's GBs first
            node_a, node_b = nodes
            assert node_a.kubelet is not None and node_b.kubelet is not None
            results["containerd"] = node_a.kubelet.version().runtime_version
            container = gpu_container(state.directory, gib)
            started = time.monotonic()
            node_a.kubelet.pull(image)
            results["pull_s"] = round(time.monotonic() - started, 1)
            results["free_gib"]["pulled_on_a"] = free_gib()
            pod_id, container_id = run_pod(node_a, image, None, container)
            before = wait_counters(state, 1, 3)
            if spec is not None:
                results["cdi_edits"] = cdi_edits(node_a.kubelet.runtime_spec(container_id), spec)
            started = time.monotonic()
            node_a.kubelet.checkpoint(container_id, ARCHIVE, timeout_s=900)
            checkpoint_s = time.monotonic() - started
            results["free_gib"]["checkpointed"] = free_gib()
            live = assert_continues(state, before)  # kubelet's checkpoint leaves the container running
            with tarfile.open(ARCHIVE) as tar:
                manifest = json.load(tar.extractfile("checkpoint/gpuckpt-manifest.json"))  # type: ignore[arg-type]
            assert manifest["processes"] and manifest["gpu_handler"] == "gpuckpt", manifest
            assert manifest["leave_running"], manifest
            inspected = harness.sh(CLI, "inspect", "--json", str(ARCHIVE)).stdout
            assert json.loads(inspected)["manifest"]["processes"], inspected
            node_a.kubelet.stop_and_remove_pod(pod_id)
            restores = {}
            for node in (node_a, node_b):  # a new pod on the same node, then on the second node
                assert node.kubelet is not None
                for written in state.directory.glob("state*"):  # only the restored process may write them now
                    written.unlink()
                started = time.monotonic()
                pod_id, container_id = run_pod(node, image, ARCHIVE, container)
                restore_s = time.monotonic() - started
                results["free_gib"][f"restored_on_{node.name}"] = free_gib()
                after = assert_continues(state, before)
                restores[node.name] = {"restore_s": round(restore_s, 3), "after": after}
                if spec is not None:
                    restores[node.name]["cdi_edits"] = cdi_edits(node.kubelet.runtime_spec(container_id), spec)
                log(f"CRI restore on {node.name}: {restore_s:.2f} s, {before} -> {after}")
                node.kubelet.stop_and_remove_pod(pod_id)
                if node is node_a:  # its image's GBs and snapshots gone before node B pulls its own
                    keep_log(node)
                    node.stop()
            results["cri_gpu"] = {
                "gib": gib, "checkpoint_s": round(checkpoint_s, 3), "archive_bytes": ARCHIVE.stat().st_size,
                "before": before, "live_after_checkpoint": live, "restores": restores,
                "manifest_timings": manifest["timings"], "cuda_processes": len(manifest["processes"]),
                "driver_files": manifest.get("driver_files")}
            log(f"CRI checkpoint {checkpoint_s:.2f} s ({ARCHIVE.stat().st_size / 2**30:.2f} GiB archive), "
                f"{before} -> {live}")
        finally:
            for node in nodes:
                try:
                    node.stop()
                except Exception as error:
                    log(f"stopping {node.name}: {error}\n{node.log_tail()}")
                keep_log(node)
            ARCHIVE.unlink(missing_ok=True)
            harness.sh("rm", "-rf", str(layout), check=False)


def keep_log(node) -> None:
    """The node's containerd log (its tail) beside the results."""
    if harness.OUT is not None and node.log.exists():
        (harness.OUT / f"cri-{node.name}-containerd.log").write_text(node.log.read_text(errors="replace")[-200_000:])


def main() -> int:
    arguments = sys.argv[1:]
    if "--inject" in arguments:
        at = arguments.index("--inject")
        harness.INJECT = arguments[at + 1] if at + 1 < len(arguments) else ""
        del arguments[at:at + 2]
    if not arguments or harness.INJECT not in harness.INJECT_MODES:
        sys.exit(f"usage: cri_gpu.py OUT_DIR [GIB] [--inject {'|'.join(harness.INJECT_MODES)}]")
    out = Path(arguments[0])
    out.mkdir(parents=True, exist_ok=True)
    harness.OUT = out
    facts = harness.install()  # the carried runc, CRIU and wheels (grpcio-tools among them) first
    results: dict = {"machine": facts["nvidia_smi"], "facts": facts, "passed": False}
    try:
        scenario(results, arguments[1] if len(arguments) > 1 else "1")
        results["passed"] = True
    except Exception as error:
        traceback.print_exc()
        results["error"] = f"{type(error).__name__}: {error}"[-3000:]
    (out / "cri_gpu.json").write_text(json.dumps(results, indent=2))
    print("cri_gpu: passed" if results["passed"] else f"cri_gpu: FAILED: {results.get('error')}")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
