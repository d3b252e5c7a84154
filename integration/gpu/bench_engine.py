"""Benchmark of the GPU checkpoint engine on the GPU machine, baseline in the same run.

1. A container holding ~16 GB of GPU memory: checkpoint+restore by the plain
   sequence done by hand (driver lock+checkpoint, `runc checkpoint`; `runc
   restore`, driver restore+unlock) and through gpuckpt-runtime, per phase.
2. One CUDA process of ~4 GiB against four of ~4 GiB each, through the shim.
3. The same 16 GB checkpoint through the shim with transparent hugepages
   `always` (host memory policy; the node's setting is put back after).
Each restored workload must verify its device data. Writes OUT/engine.json.
Usage (root, repository root): python3 integration/gpu/bench_engine.py OUT_DIR [GIB]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import RUNTIME_ROOT, SITE, Bundle, assert_continues, install, log, manifest, wait_counters  # noqa: E402

# gpuckpt is importable on the GPU machine only from harness.install()'s SITE, with its wheels
sys.path.insert(0, str(SITE))
from gpuckpt.cuda.discovery import find_cuda_pids  # noqa: E402
from gpuckpt.cuda.driver import load_driver  # noqa: E402
from gpuckpt.cuda.suspend import checkpointed_pids as driver_checkpointed  # noqa: E402
from gpuckpt.host.procfs import descendants  # noqa: E402

COUNTER = ["python3", "/work/gpu_counter.py"]
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def cuda_pids_of(bundle: Bundle) -> list[int]:
    return find_cuda_pids(descendants(bundle.state()["pid"]))


def checkpointed_pids(driver, bundle: Bundle) -> list[int]:
    """After `runc restore` the processes hold no device file: ask the driver which are checkpointed."""
    return driver_checkpointed(driver, descendants(bundle.state()["pid"]))


def plain_sequence(gib: str, images: Path) -> dict:
    """By hand: the driver calls one process at a time, runc directly, no shim."""
    driver = load_driver()
    bundle = Bundle("plain", COUNTER, {"GIB": gib})
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3, timeout_s=600)
        pids = cuda_pids_of(bundle)
        phases: dict[str, float] = {}
        started = time.monotonic()
        for pid in pids:
            driver.lock(pid, 10_000)
        phases["lock_s"] = time.monotonic() - started
        mark = time.monotonic()
        for pid in pids:
            driver.checkpoint(pid)
        phases["device_checkpoint_s"] = time.monotonic() - mark
        mark = time.monotonic()
        subprocess.run(["runc", "--root", RUNTIME_ROOT, "checkpoint", "--image-path", str(images), bundle.name],
                       check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        phases["dump_s"] = time.monotonic() - mark
        phases["checkpoint_total_s"] = time.monotonic() - started
        started = time.monotonic()
        with open(os.devnull, "r+b") as null:
            subprocess.run(["runc", "--root", RUNTIME_ROOT, "restore", "-d", "--bundle", str(bundle.dir),
                            "--image-path", str(images), bundle.name], check=True, cwd=bundle.dir,
                           stdin=null, stdout=null, stderr=null)
        phases["runc_restore_s"] = time.monotonic() - started
        mark = time.monotonic()
        driver.init()
        restored = checkpointed_pids(driver, bundle)
        for pid in restored:
            driver.restore(pid)
        phases["device_restore_s"] = time.monotonic() - mark
        mark = time.monotonic()
        for pid in restored:
            driver.unlock(pid)
        phases["unlock_s"] = time.monotonic() - mark
        phases["restore_total_s"] = time.monotonic() - started
        assert_continues(bundle, before)
        return phases
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def shim_sequence(gib: str, procs: int, images: Path) -> dict:
    bundle = Bundle(f"shim{procs}", COUNTER, {"GIB": gib, "PROCS": str(procs)})
    try:
        bundle.start()
        before = wait_counters(bundle, procs, 3, timeout_s=600)
        checkpoint_s, _ = bundle.checkpoint(images)
        timings = manifest(images)["timings"]
        restore_s = bundle.restore(images)
        restore_phases = [line for line in bundle.last_messages.splitlines() if "restored" in line]
        assert_continues(bundle, before)
        return {"checkpoint_total_s": checkpoint_s, "restore_total_s": restore_s, **timings,
                "restore_phases": restore_phases[-1][-300:] if restore_phases else ""}
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def rounded(values: dict) -> dict:
    return {key: round(value, 3) if isinstance(value, float) else value for key, value in values.items()}


def main() -> int:
    out = Path(sys.argv[1])
    gib = sys.argv[2] if len(sys.argv) > 2 else "16"
    facts = install()
    config = Path("/etc/gpuckpt/config.toml")
    plain_config = config.read_text()
    # The shim's own rows leave the node's THP setting alone, as the plain sequence does; the hugepages
    # row below sets it (the default since cuda.host_hugepages became "always")
    config.write_text(plain_config + '[cuda]\nhost_hugepages = "leave"\n')
    images = Path("/dev/shm/gpuckpt-bench")
    result: dict = {"machine": facts["nvidia_smi"], "facts": facts, "gib": float(gib), "image_dir": str(images)}

    def save() -> None:
        (out / "engine.json").write_text(json.dumps(result, indent=2))

    log(f"--- plain sequence, {gib} GiB")
    result["plain"] = rounded(plain_sequence(gib, images))
    save()
    log(f"plain: {result['plain']}")
    log(f"--- shim, {gib} GiB")
    result["shim"] = rounded(shim_sequence(gib, 1, images))
    save()
    log(f"shim: {result['shim']}")
    result["plain_checkpoint_s"] = result["plain"]["checkpoint_total_s"]
    result["shim_checkpoint_s"] = result["shim"]["checkpoint_total_s"]
    result["plain_restore_s"] = result["plain"]["restore_total_s"]
    result["shim_restore_s"] = result["shim"]["restore_total_s"]
    result["shim_overhead_checkpoint_pct"] = round(
        100 * (result["shim_checkpoint_s"] / result["plain_checkpoint_s"] - 1), 1
    )
    result["shim_overhead_restore_pct"] = round(100 * (result["shim_restore_s"] / result["plain_restore_s"] - 1), 1)
    save()
    log("--- one vs four processes of 4 GiB")
    one = rounded(shim_sequence("4", 1, images))
    four = rounded(shim_sequence("4", 4, images))
    result.update(one_proc=one, four_proc=four, one_proc_checkpoint_s=one["checkpoint_total_s"],
                  four_proc_checkpoint_s=four["checkpoint_total_s"],
                  four_over_one_device_checkpoint=round(four["device_checkpoint_s"] / one["device_checkpoint_s"], 2),
                  four_over_one_total=round(four["checkpoint_total_s"] / one["checkpoint_total_s"], 2))
    save()
    log(f"one: {one}; four: {four}")
    before_mode = THP.read_text().strip()
    try:
        config.write_text(plain_config + '[cuda]\nhost_hugepages = "always"\n')
        log(f"--- shim, {gib} GiB, cuda.host_hugepages = always (node: {before_mode})")
        result["shim_thp_always"] = rounded(shim_sequence(gib, 1, images))
    finally:
        config.write_text(plain_config)
    result["thp_setting_restored"] = THP.read_text().strip() == before_mode
    result["shim_thp_checkpoint_s"] = result["shim_thp_always"]["checkpoint_total_s"]
    result["shim_thp_restore_s"] = result["shim_thp_always"]["restore_total_s"]
    save()
    log(f"shim THP always: {result['shim_thp_always']}")
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
