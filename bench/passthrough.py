"""Pass-through overhead of gpuckpt-runtime on `state` of a running container.

Starts one container with the delegate (runc by default) from the test bed's
rootfs, then times `DELEGATE state ID` and `gpuckpt-runtime state ID`
interleaved, and prints both medians and the difference side by side.
Writes results/bench/passthrough.json. Run as root after integration/testbed/setup.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOTFS_TAR = "/var/cache/gpuckpt-testbed/rootfs-python.tar"
RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench" / "passthrough.json"
BUDGET_MS = 5.0  # issue #15: pass-through adds at most 5 ms


def time_once(argv: list[str]) -> float:
    """Wall time of one run, spawned with posix_spawn so the harness adds little of its own."""
    started = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=[
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
    _, status = os.waitpid(pid, 0)
    elapsed = (time.perf_counter() - started) * 1000
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed")
    return elapsed


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{platform.node()} ({os.cpu_count()} cores, {cpu}, kernel {platform.release()})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--delegate", default="runc")
    parser.add_argument("--shim", default=shutil.which("gpuckpt-runtime") or "/usr/local/bin/gpuckpt-runtime")
    options = parser.parse_args()
    delegate = shutil.which(options.delegate)
    root = "/run/gpuckpt-bench"
    container_id = f"bench-{os.getpid()}"
    with tempfile.TemporaryDirectory() as bundle:
        rootfs = Path(bundle) / "rootfs"
        rootfs.mkdir()
        subprocess.run(["tar", "-C", str(rootfs), "-xf", ROOTFS_TAR], check=True)
        subprocess.run([delegate, "spec"], cwd=bundle, check=True)
        spec = json.loads((Path(bundle) / "config.json").read_text())
        spec["process"].update(terminal=False, args=["sleep", "3600"])
        (Path(bundle) / "config.json").write_text(json.dumps(spec))
        with open(os.devnull, "r+b") as null:
            subprocess.run([delegate, "--root", root, "run", "-d", container_id], cwd=bundle, check=True,
                           stdin=null, stdout=null, stderr=null)
        try:
            delegate_argv = [delegate, "--root", root, "state", container_id]
            shim_argv = [options.shim, "--root", root, "state", container_id]
            for _ in range(10):  # warm caches, the shim's delegate cache included
                time_once(delegate_argv), time_once(shim_argv)
            delegate_ms, shim_ms = [], []
            for _ in range(options.runs):
                delegate_ms.append(time_once(delegate_argv))
                shim_ms.append(time_once(shim_argv))
        finally:
            subprocess.run([delegate, "--root", root, "delete", "--force", container_id], check=False)
    delegate_version = subprocess.run([delegate, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    result = {
        "machine": machine(),
        "delegate": f"{delegate} ({delegate_version})",
        "runs": options.runs,
        "delegate_ms_median": round(statistics.median(delegate_ms), 3),
        "shim_ms_median": round(statistics.median(shim_ms), 3),
        "overhead_ms": round(statistics.median(shim_ms) - statistics.median(delegate_ms), 3),
        "delegate_ms_p90": round(statistics.quantiles(delegate_ms, n=10)[-1], 3),
        "shim_ms_p90": round(statistics.quantiles(shim_ms, n=10)[-1], 3),
        "budget_ms": BUDGET_MS,
    }
    result["within_budget"] = result["overhead_ms"] <= BUDGET_MS
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':22}{'median ms':>10}{'p90 ms':>10}")
    print(f"{'delegate state':22}{result['delegate_ms_median']:>10.2f}{result['delegate_ms_p90']:>10.2f}")
    print(f"{'gpuckpt-runtime state':22}{result['shim_ms_median']:>10.2f}{result['shim_ms_p90']:>10.2f}")
    print(f"overhead {result['overhead_ms']:.2f} ms (budget {BUDGET_MS} ms): "
          f"{'within' if result['within_budget'] else 'OVER'} budget; written to {RESULTS}")


if __name__ == "__main__":
    main()
