"""What gpuckpt-hook costs a container start (issue #13: <= 30 ms median on the CI machine).

Two measures, each side by side with its baseline in the same run:
- the hook process alone, as an engine runs it (`gpuckpt-hook createRuntime`, the state on
  stdin): for a CPU container (read config.json, return) and for a GPU container (read the
  driver's GPU list, write the inventory record), against /bin/true spawned the same way;
- `podman run --rm IMAGE true` with the hooks.d files `gpuckpt install` writes vs with an empty
  hooks directory, interleaved.
The GPU container's "driver" is a /proc/driver/nvidia tree made here (GPUCKPT_NVIDIA_PROC) and its
records go to a temporary state directory; nothing of the node's is touched.

Usage (root, on a set-up node): python3 bench/hook_cost.py [--runs N] [--starts N]
Writes results/bench/hook_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from passthrough import machine

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench" / "hook_cost.json"
IMAGE = "localhost/gpuckpt-test:latest"
BUDGET_MS = 30.0


def time_with_stdin(argv: list[str], stdin_path: str, env: dict[str, str]) -> float:
    """Wall time of one run with stdin from a file, spawned with posix_spawn."""
    started = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[
        (os.POSIX_SPAWN_OPEN, 0, stdin_path, os.O_RDONLY, 0), (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
    _, status = os.waitpid(pid, 0)
    elapsed = (time.perf_counter() - started) * 1000
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed")
    return elapsed


def figures(samples: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(samples), 2),
            "p90_ms": round(statistics.quantiles(samples, n=10)[-1], 2)}


def bundle(work: Path, name: str, devices: list[str]) -> Path:
    path = work / name
    path.mkdir()
    spec = {"ociVersion": "1.2.0", "process": {"args": ["true"], "env": ["PATH=/bin"]}, "root": {"path": "rootfs"},
            "linux": {"devices": [{"path": device, "type": "c", "major": 195, "minor": 0} for device in devices]}}
    (path / "config.json").write_text(json.dumps(spec))
    (work / f"{name}.state").write_text(json.dumps({"ociVersion": "1.2.0", "id": f"bench-{name}", "status": "creating",
                                                    "pid": os.getpid(), "bundle": str(path), "annotations": {}}))
    return work / f"{name}.state"


def hook_alone(hook: str, runs: int, work: Path) -> dict[str, dict[str, float]]:
    information = work / "proc" / "gpus" / "0000:01:00.0" / "information"
    information.parent.mkdir(parents=True)
    information.write_text("Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-0badc0de-0000-4000-8000-000000000000\n"
                           "Device Minor: \t 0\n")
    env = {"PATH": "/usr/bin:/bin", "GPUCKPT_STATE_DIR": str(work / "state"), "GPUCKPT_NVIDIA_PROC": str(work / "proc")}
    cases = {"true": (["/bin/true"], bundle(work, "cpu", [])),
             "hook, CPU container": ([hook, "createRuntime"], work / "cpu.state"),
             "hook, GPU container": ([hook, "createRuntime"], bundle(work, "gpu", ["/dev/nvidia0", "/dev/nvidiactl"]))}
    samples: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(10):  # page cache, pyc files
        for argv, state in cases.values():
            time_with_stdin(argv, str(state), env)
    for _ in range(runs):
        for case, (argv, state) in cases.items():
            samples[case].append(time_with_stdin(argv, str(state), env))
    return {case: figures(values) for case, values in samples.items()}


def podman_start(hooks_dir: str, hooks: str) -> float:
    started = time.perf_counter()
    subprocess.run(["podman", "--hooks-dir", hooks_dir if hooks else hooks, "run", "--rm", "--network", "none",
                    IMAGE, "true"], check=True, capture_output=True)
    return (time.perf_counter() - started) * 1000


def container_starts(starts: int, work: Path) -> dict[str, dict[str, float]]:
    empty = work / "no-hooks"
    empty.mkdir()
    cases = {"podman run, no hook": str(empty), "podman run, gpuckpt-hook": "/etc/containers/oci/hooks.d"}
    samples: dict[str, list[float]] = {case: [] for case in cases}
    for hooks_dir in cases.values():
        podman_start(hooks_dir, hooks_dir)
    for _ in range(starts):
        for case, hooks_dir in cases.items():
            samples[case].append(podman_start(hooks_dir, hooks_dir))
    return {case: figures(values) for case, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="hook runs per case")
    parser.add_argument("--starts", type=int, default=30, help="container starts per case")
    parser.add_argument("--hook", default=shutil.which("gpuckpt-hook") or "/usr/local/bin/gpuckpt-hook")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        alone = hook_alone(options.hook, options.runs, Path(work))
        starts = container_starts(options.starts, Path(work))
    hook_ms = max(alone["hook, CPU container"]["median_ms"], alone["hook, GPU container"]["median_ms"])
    result = {"machine": machine(), "hook": options.hook, "runs": options.runs, "starts": options.starts,
              "hook_alone": alone, "container_start": starts,
              "start_overhead_ms": round(starts["podman run, gpuckpt-hook"]["median_ms"]
                                         - starts["podman run, no hook"]["median_ms"], 2),
              "budget_ms": BUDGET_MS, "within_budget": hook_ms <= BUDGET_MS}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':28}{'median ms':>10}{'p90 ms':>10}")
    for case, values in {**alone, **starts}.items():
        print(f"{case:28}{values['median_ms']:>10.2f}{values['p90_ms']:>10.2f}")
    print(f"container start overhead {result['start_overhead_ms']:.2f} ms (median difference); hook median "
          f"{hook_ms:.2f} ms, budget {BUDGET_MS} ms: {'within' if result['within_budget'] else 'OVER'}; "
          f"written to {RESULTS}")


if __name__ == "__main__":
    main()
