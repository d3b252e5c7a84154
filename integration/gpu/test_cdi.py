"""GPU containers as users start them: `podman run --device nvidia.com/gpu=0` from a self-contained image (its own
Python, PyTorch and CUDA runtime libraries: image.py), the driver brought only by the node's CDI spec in
nvidia-ctk's shape (cdi.py). Each workload (PyTorch's gpu_counter.py, and driver_counter.py: the driver API through
ctypes, a JIT-compiled PTX kernel) is checkpointed and restored, exported with --leave-running while it goes on,
removed and imported: the same process each time, its device data intact. Run with `--inject cdi`."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import cdi
import harness
import pytest
from harness import CLI, COUNTER, WORK, Bundle, assert_continues, log, manifest, sh, wait_counters

pytestmark = pytest.mark.gpu

WORKLOADS = {"torch": COUNTER, "ctypes": ["python3", "/work/driver_counter.py"]}


def container_mounts(pid: int) -> list[tuple[str, str]]:
    """(source within its filesystem, mount point) of each mount the container's init sees."""
    return [(fields[3], fields[4]) for fields in
            (line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines())]


def container_pid(podman: harness.Podman, name: str) -> int:
    return int(podman.cli("inspect", "--format", "{{.State.Pid}}", name).stdout.strip())


def injected(podman: harness.Podman, name: str, spec: dict) -> dict:
    """What the container got from the CDI spec, and proof that nothing of the host's userland is bound in."""
    mounts = container_mounts(container_pid(podman, name))
    targets = {target for _, target in mounts}
    # where each lands in this image (runc follows its links: /lib/firmware/... is mounted at /usr/lib/firmware/...)
    driver_files = ["/" + str(cdi.inside(harness.IMAGE_ROOT, m["containerPath"]).relative_to(harness.IMAGE_ROOT))
                    for m in spec["containerEdits"]["mounts"]]
    libcuda = next(path for path in driver_files if os.path.basename(path).startswith("libcuda.so."))
    link = podman.cli("exec", name, "python3", "-c",
                      f"import os; print(os.readlink({os.path.join(os.path.dirname(libcuda), 'libcuda.so.1')!r}))")
    found = {"driver_files_mounted": sorted(targets & set(driver_files)),
             "driver_files_missing": sorted(set(driver_files) - targets),
             "libcuda_so_1": link.stdout.strip(),
             "host_userland_bound": sorted(t for t in targets if t in ("/usr", "/opt/torch", "/usr/local/nvidia"))}
    assert not found["driver_files_missing"], found
    assert not found["host_userland_bound"], found
    assert found["libcuda_so_1"] == os.path.basename(libcuda), found  # the create-symlinks hook's link
    return found


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@harness.nftables_network_lock()  # podman gives even --network none a netns; no iptables there
def test_cdi_podman(results: dict, podman: harness.Podman, workload: str) -> None:
    if harness.INJECT != "cdi":
        pytest.skip("CDI scenarios run with --inject cdi (or GPUCKPT_GPU_INJECT=cdi)")
    name = f"gpu-cdi-{workload}-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    archive = Path("/var/tmp") / f"{name}.tar.zst"
    spec = harness.cdi_spec()
    found: dict = {"spec_kind": spec["kind"], "devices": [d["name"] for d in spec["devices"]]}
    results[f"cdi_podman_{workload}"] = found
    try:
        found.update(podman.import_rootfs())  # the first scenario imports; "kept" after
        podman.run_gpu(name, WORKLOADS[workload], {"GIB": "1", "STATE": "/state/state"}, state)
        before = wait_counters(state, 1, 3, timeout_s=180)
        found["injected"] = injected(podman, name, spec)

        started = time.monotonic()
        podman.cli("container", "checkpoint", name)
        checkpoint_s = time.monotonic() - started
        podman.cli("container", "restore", name)
        found["checkpoint_s"] = round(checkpoint_s, 2)
        found["restore_s"] = round(time.monotonic() - started - checkpoint_s, 2)
        before = assert_continues(state, before)
        found["after_restore"] = before
        # the restored container keeps the hook's link and the driver files at their host paths (no hook runs at
        # a restore: the link lives in the container's own layer, the files are bind mounts runc makes again)
        found["injected_after_restore"] = injected(podman, name, spec)
        log(f"cdi {workload}: checkpoint {checkpoint_s:.1f} s, restore {found['restore_s']} s, {before}")

        started = time.monotonic()
        sh(CLI, "export", "--leave-running", name, "-o", str(archive), env=podman.env)
        found["export_leave_running_s"] = round(time.monotonic() - started, 2)
        at_export = before
        before = assert_continues(state, before)  # the original goes on
        inside = json.loads(sh(CLI, "inspect", "--json", str(archive), env=podman.env).stdout)
        assert inside["manifest"]["processes"], inside["manifest"]
        podman.cli("rm", "-f", name)
        (state.directory / "state.0").unlink()  # only the imported process may write it again
        started = time.monotonic()
        # --trust-config: the CDI spec's per-file driver mounts are host paths, which an import refuses unless told
        imported = sh(CLI, "import", "--trust-config", str(archive), env=podman.env)
        found["import_s"] = round(time.monotonic() - started, 2)
        found["after_import"] = assert_continues(state, at_export)
        found["import_output"] = imported.stdout.strip()[-300:]
        found["injected_after_import"] = injected(podman, name, spec)
        log(f"cdi {workload}: export --leave-running {found['export_leave_running_s']} s, import "
            f"{found['import_s']} s, {found['after_import']}")
    finally:
        podman.cli("rm", "-f", name, check=False)
        archive.unlink(missing_ok=True)
        Path(f"{archive}.sig").unlink(missing_ok=True)


def other_node_mounts(config: dict, version: str, other: str, root: Path) -> dict:
    """The bundle's config as another node's CDI spec would make it: each file of driver `version` mounted at its
    path for driver `other`, from a copy of it under `root` (that node's files)."""
    changed = json.loads(json.dumps(config))
    for mount in changed["mounts"]:
        if version in os.path.basename(mount["destination"]):
            mount["destination"] = mount["destination"].replace(version, other)
            source = root / mount["destination"].lstrip("/")
            source.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(mount["source"], source)
            mount["source"] = str(source)
    return changed


def test_cdi_driver_change_refused(results: dict) -> None:
    """Issue 32 item 4 on the real driver: a runc bundle in CDI mode checkpointed; its restore under the config another
    node's spec would give it (the driver files of another version) and under its own config whose driver files this
    node lacks (an archive's config from elsewhere, cuda-checkpoint#21) are refused before runc and CRIU run, the
    container left checkpointed; under this node's spec it restores and goes on with its device data."""
    if harness.INJECT != "cdi":
        pytest.skip("CDI scenarios run with --inject cdi (or GPUCKPT_GPU_INJECT=cdi)")
    version = cdi.driver_version()
    other = f"{version.split('.')[0]}.1.1"  # the same branch: cuda.driver_version_policy "same-major" would pass it
    bundle = Bundle("drvchg", COUNTER, {"GIB": "1"})
    images = Path("/dev/shm") / f"gpuckpt-img-{bundle.name}"
    other_root = WORK / f"{bundle.name}-other-node"
    found: dict = {"driver_version": version, "other_version": other}
    results["cdi_driver_change"] = found
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3)
        bundle.checkpoint(images)
        recorded = manifest(images)["driver_files"]
        found["recorded"] = recorded
        libcuda = next(r for r in recorded if os.path.basename(r["path"]).startswith("libcuda.so."))
        assert libcuda["version"] == version and libcuda["host_path"], recorded

        config_path = bundle.dir / "config.json"
        own = json.loads(config_path.read_text())
        config_path.write_text(json.dumps(other_node_mounts(own, version, other, other_root)))
        refused = bundle.runtime("restore", "-d", "--bundle", str(bundle.dir), "--image-path", str(images),
                                 "--pid-file", str(bundle.dir / "restored.pid"), bundle.name, check=False)
        found["other_spec"] = {"exit": refused.returncode, "messages": refused.stderr.strip()[-600:]}
        assert refused.returncode == 1, found
        assert f"run NVIDIA driver {version}" in refused.stderr and f"brings driver {other}'s files" in refused.stderr
        assert bundle.runtime("state", bundle.name, check=False).returncode != 0  # nothing was restored

        lacking = json.loads(json.dumps(own))
        mount = next(m for m in lacking["mounts"] if m["destination"] == libcuda["path"])
        mount["source"] = str(other_root / "gone" / os.path.basename(mount["source"]))
        config_path.write_text(json.dumps(lacking))
        refused = bundle.runtime("restore", "-d", "--bundle", str(bundle.dir), "--image-path", str(images),
                                 "--pid-file", str(bundle.dir / "restored.pid"), bundle.name, check=False)
        found["files_lacking"] = {"exit": refused.returncode, "messages": refused.stderr.strip()[-600:]}
        assert refused.returncode == 1 and "which this node does not have" in refused.stderr, found
        assert bundle.runtime("state", bundle.name, check=False).returncode != 0

        config_path.write_text(json.dumps(own))  # this node's spec: the same driver restores
        found["restore_s"] = round(bundle.restore(images), 2)
        found["after"] = assert_continues(bundle, before)
        log(f"cdi driver change: {other}'s spec and lacking files refused, {version}'s restored in "
            f"{found['restore_s']} s, {found['after']}")
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)
        shutil.rmtree(other_root, ignore_errors=True)
