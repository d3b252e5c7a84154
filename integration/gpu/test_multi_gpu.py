"""Two GPUs: a checkpoint restored on the other GPU (the UUID remapped), a live NCCL job refused without the
settings the driver needs and checkpointed and restored with them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import harness
import pytest
from harness import (
    COUNTER,
    NCCL_KEEP,
    NCCL_SAFE,
    RUNTIME_ROOT,
    Bundle,
    assert_continues,
    log,
    nvidia_devices,
    sh,
    wait_counters,
)

pytestmark = pytest.mark.gpu


def test_restore_on_other_gpu(results: dict, two_gpus: None) -> None:
    """Checkpointed on GPU 0, restored in a bundle that gives the container GPU 1: the shim remaps the UUID."""
    bundle = Bundle("remap", COUNTER, {"GIB": "2"}, gpu_minors=[0])
    images = Path("/dev/shm/gpuckpt-img-remap")
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3)
        bundle.checkpoint(images)
        spec = json.loads((bundle.dir / "config.json").read_text())
        spec["linux"]["devices"] = nvidia_devices([1])
        (bundle.dir / "config.json").write_text(json.dumps(spec, indent=1))
        try:
            restore_s = bundle.restore(images)
        except RuntimeError:
            bundle.destroy()
            results["remap_diagnosis"] = diagnose_remap()
            raise
        assert_continues(bundle, before)
        on_gpu1 = sh("nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader").stdout
        results["restore_on_other_gpu"] = {"restore_s": round(restore_s, 3), "compute_apps": on_gpu1.strip(),
                                           "log": bundle.last_messages.strip()[-500:]}
        log(f"restore on GPU 1: {restore_s:.2f} s; compute apps now: {on_gpu1.strip()}")
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def diagnose_remap() -> list[dict]:
    """By hand, after the shim's remapped restore failed: which device nodes and pairs let the driver
    restore a process checkpointed on GPU 0 into a container given GPU 1 (a failed restore leaves
    the process checkpointed, so each variant is tried on the same process)."""
    # gpuckpt is importable on the GPU machine only once harness.install() has filled SITE
    sys.path.insert(0, str(harness.SITE))
    from gpuckpt.cuda.devices import list_gpus
    from gpuckpt.cuda.driver import GpuPair, load_driver
    from gpuckpt.oci.spec import read_spec
    from gpuckpt.shim.devnodes import sync_nvidia_nodes

    tried: list[dict] = []
    bundle = Bundle("remapdiag", COUNTER, {"GIB": "2"}, gpu_minors=[0])
    images = Path("/dev/shm/gpuckpt-img-remapdiag")
    try:
        bundle.start()
        wait_counters(bundle, 1, 3)
        bundle.checkpoint(images)
        spec = json.loads((bundle.dir / "config.json").read_text())
        spec["linux"]["devices"] = nvidia_devices([1])
        (bundle.dir / "config.json").write_text(json.dumps(spec, indent=1))
        sh("runc", "--root", RUNTIME_ROOT, "restore", "-d", "--bundle", str(bundle.dir), "--image-path", str(images),
           bundle.name, stdin=subprocess.DEVNULL)
        init = int(json.loads(sh("runc", "--root", RUNTIME_ROOT, "state", bundle.name).stdout)["pid"])
        pids = [int(p) for p in sh("runc", "--root", RUNTIME_ROOT, "ps", "--format", "json", bundle.name).stdout
                .strip("[]\n").split(",") if p.strip()]
        uuids = [gpu.uuid for gpu in list_gpus()]
        driver = load_driver()
        driver.init()
        dev = lambda: sorted(os.listdir(f"/proc/{init}/root/dev"))  # noqa: E731
        one, swap = [GpuPair(uuids[0], uuids[1])], [GpuPair(uuids[0], uuids[1]), GpuPair(uuids[1], uuids[0])]
        for label, fix_nodes, pairs in (("old /dev, one pair", False, one), ("old /dev, permutation", False, swap),
                                        ("spec /dev, one pair", True, one), ("spec /dev, permutation", True, swap)):
            if fix_nodes:
                sync_nvidia_nodes(init, read_spec(str(bundle.dir)).linux.devices)
            entry = {"variant": label, "dev": dev(), "pids": pids}
            try:
                for pid in pids:
                    if driver.state(pid).name == "CHECKPOINTED":
                        driver.restore(pid, pairs)
                for pid in pids:
                    driver.unlock(pid)
                entry["result"] = "restored"
            except Exception as error:  # record every variant's answer
                entry["result"] = f"{type(error).__name__}: {error}"
            tried.append(entry)
            log(f"remap diagnosis: {entry}")
            if entry["result"] == "restored":
                break
    except Exception as error:
        tried.append({"error": f"{type(error).__name__}: {error}"[-1000:]})
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)
    return tried


def test_nccl(results: dict, two_gpus: None) -> None:
    """A live 2-rank NCCL job: refused without the safe settings (and keeps running); checkpointed,
    restored and still all-reducing correctly with them."""
    record: dict = {}
    unsafe = Bundle("nccl-unsafe", ["python3", "/work/nccl_job.py"], {"NCCL_NVLS_ENABLE": "0", **NCCL_KEEP},
                    gpu_minors=[0, 1], own_network=True)
    try:
        unsafe.start()
        before = wait_counters(unsafe, 2, 3, timeout_s=300)
        _, refused = unsafe.checkpoint(Path("/dev/shm/gpuckpt-img-nccl-unsafe"), check=False)
        assert refused.returncode != 0 and "NCCL_P2P_DISABLE=1" in refused.stderr, refused.stderr
        assert_continues(unsafe, before)
        record["refused_message"] = refused.stderr.strip()[-400:]
        log(f"nccl without safe settings: refused, job goes on: {refused.stderr.strip()[-200:]}")
    finally:
        unsafe.destroy()
    # The job's own network namespace holds its loopback TCP connections; there is no iptables
    # binary here, so CRIU (through runc's config file) locks it with libnftables.
    Path("/etc/criu").mkdir(exist_ok=True)
    Path("/etc/criu/runc.conf").write_text("network-lock nftables\n")
    safe = Bundle("nccl-safe", ["python3", "/work/nccl_job.py"], {"NCCL_NVLS_ENABLE": "0", **NCCL_KEEP, **NCCL_SAFE},
                  gpu_minors=[0, 1], own_network=True)
    images = Path("/dev/shm/gpuckpt-img-nccl")
    try:
        safe.start()
        before = wait_counters(safe, 2, 3, timeout_s=300)
        checkpoint_s, _ = safe.checkpoint(images, "--tcp-established")
        safe.renew_netns()
        restore_s = safe.restore(images, "--tcp-established")
        after = assert_continues(safe, before)
        record.update(checkpoint_s=round(checkpoint_s, 3), restore_s=round(restore_s, 3), after=after)
        log(f"nccl with safe settings: checkpoint {checkpoint_s:.2f} s, restore {restore_s:.2f} s, {before} -> {after}")
    finally:
        safe.destroy()
        shutil.rmtree(images, ignore_errors=True)
        Path("/etc/criu/runc.conf").unlink(missing_ok=True)
    results["nccl"] = record
