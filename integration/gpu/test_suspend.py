"""gpuckpt suspend and resume of a CUDA container: its GPU memory freed for another job, resume refused while
that memory is taken, with hugepages, and resumed on another GPU."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from harness import (
    CLI,
    COUNTER,
    RUNTIME_ROOT,
    TORCH_PYTHON,
    Bundle,
    assert_continues,
    gpu_memory_used_mib,
    log,
    sh,
    wait_counters,
)

pytestmark = pytest.mark.gpu


HOG = """
import sys, torch
gib = float(sys.argv[1])
block = torch.ones(int(gib * 2**30) // 4, device="cuda")
total = float(block.sum())
assert total == block.numel(), total
print(f"hog: {gib} GiB allocated and summed", flush=True)
"""


def test_suspend(results: dict) -> None:
    """A 16 GiB workload suspended: its GPU memory is freed, another process allocates and computes
    in it; resume is refused while that memory is taken (the workload stays suspended), then resumes
    and the workload verifies its device data. The same container's full checkpoint/restore for scale."""
    suspend_and_full_checkpoint(results, "suspend")


def test_suspend_hugepages(results: dict) -> None:
    """The same with cuda.host_hugepages = "always" (suspend and resume take it too): each beside the full
    checkpoint and restore under the same setting, and the node's THP setting as it was after."""
    config = Path("/etc/gpuckpt/config.toml")
    plain = config.read_text()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    before = thp.read_text().strip()
    config.write_text(plain + '[cuda]\nhost_hugepages = "always"\n')
    try:
        suspend_and_full_checkpoint(results, "suspend_hugepages")
    finally:
        config.write_text(plain)
    results["suspend_hugepages"].update(thp_before=before, thp_after=thp.read_text().strip())
    assert thp.read_text().strip() == before, "the node's THP setting was not put back"


def suspend_and_full_checkpoint(results: dict, key: str) -> None:
    bundle = Bundle(key.replace("_", ""), COUNTER, {"GIB": "16"})
    images = Path(f"/dev/shm/gpuckpt-img-{key}")
    record: dict = {}
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3, timeout_s=300)
        used_before = gpu_memory_used_mib()
        started = time.monotonic()
        out = sh(CLI, "suspend", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT).stdout.strip()
        record["suspend_s"] = round(time.monotonic() - started, 3)
        used_suspended = gpu_memory_used_mib()
        status = sh(CLI, "status", "--json").stdout
        assert bundle.name in status
        total_mib = int(sh("nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits").stdout.split()[0])
        hog_gib = (total_mib - used_suspended) / 1024 - 4
        hog = subprocess.Popen([TORCH_PYTHON, "-c", HOG + "\nimport time; time.sleep(30)", str(hog_gib)],
                               stdout=subprocess.PIPE, text=True)
        assert "hog:" in hog.stdout.readline(), "the other job could not use the freed memory"
        refused = subprocess.run([CLI, "resume", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT],
                                 capture_output=True, text=True)
        assert refused.returncode != 0 and "stays suspended" in refused.stderr, refused.stderr
        assert bundle.name in sh(CLI, "status", "--json").stdout
        hog.kill()
        hog.wait()
        time.sleep(1)
        started = time.monotonic()
        sh(CLI, "resume", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT)
        record["resume_s"] = round(time.monotonic() - started, 3)
        assert_continues(bundle, before)
        record.update(
            gpu_used_mib_before=used_before,
            gpu_used_mib_suspended=used_suspended,
            other_job_gib=round(hog_gib, 1),
            refused_message=refused.stderr.strip()[-300:],
            suspend_output=out,
        )
        log(f"{key}: {record}")
        current = wait_counters(bundle, 1, 1)
        record["full_checkpoint_s"], _ = bundle.checkpoint(images)
        record["full_restore_s"] = bundle.restore(images)
        assert_continues(bundle, current)
        record["full_checkpoint_s"] = round(record["full_checkpoint_s"], 3)
        record["full_restore_s"] = round(record["full_restore_s"], 3)
        record["suspend_over_full_checkpoint"] = round(record["suspend_s"] / record["full_checkpoint_s"], 3)
        log(f"{key}: full checkpoint {record['full_checkpoint_s']} s, restore {record['full_restore_s']} s; suspend "
            f"over full checkpoint {record['suspend_over_full_checkpoint']}")
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)
    results[key] = record


def test_suspend_other_gpu(results: dict, two_gpus: None) -> None:
    """Suspended on GPU 0, resumed on GPU 1 (`gpuckpt resume --gpu UUID`): the same process goes on there
    with its device data intact. The container is given both GPUs, so it can reach the second."""
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in sh("nvidia-smi", "-L").stdout.strip().splitlines()]
    bundle = Bundle("suspend2", COUNTER, {"GIB": "16"}, gpu_minors=[0, 1])
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3, timeout_s=300)
        pid = int((bundle.dir / "pid").read_text())
        started = time.monotonic()
        sh(CLI, "suspend", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT)
        suspend_s = time.monotonic() - started
        started = time.monotonic()
        out = sh(
            CLI, "resume", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT, "--gpu", uuids[1]
        ).stdout.strip()
        resume_s = time.monotonic() - started
        after = assert_continues(bundle, before)
        apps = sh("nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader").stdout.strip()
        on = [line for line in apps.splitlines() if line.split(",")[1].strip() == uuids[1]]
        assert on and all(line.split(",")[1].strip() == uuids[1] for line in apps.splitlines()), apps
        results.setdefault("suspend_other_gpu", {}).update(
            suspend_s=round(suspend_s, 3), resume_on_gpu1_s=round(resume_s, 3), compute_apps_after=apps,
            container_init_pid=pid, before=before, after=after, resume_output=out)
        log(f"suspend on GPU 0 {suspend_s:.2f} s, resume on GPU 1 {resume_s:.2f} s; apps now {apps}")
    finally:
        bundle.destroy()
