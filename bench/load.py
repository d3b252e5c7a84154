"""The node under concurrent work (issue #16, item 3): containers through their whole lifecycle via
gpuckpt-runtime at once, then checkpoint/restore cycles of one container, every restore verified;
with the pass-through latency (`state`) of the shim and of runc sampled side by side meanwhile.

Phase 1: --containers podman containers (gpuckpt-runtime as their runtime, runc its delegate, the
test bed's counter workload: a random token and a 16 MiB random buffer whose checksum it rechecks
every tick), all at once from a thread each: run, exec, checkpoint, restore (the workload must go
on: same token and checksum, counter further), stop, rm. Phase 2: --cycles checkpoint/restore
cycles of one such container, each verified the same way. Meanwhile a sampler times
`gpuckpt-runtime state ID` and `runc state ID` of a bystander container, interleaved, every 0.2 s.

A failure is any step that exits non-zero or a restore that does not go on from its checkpoint;
each is counted and its last lines kept. Writes results/bench/load.json (`failures`: the count).
Run as root on a node set up by integration/testbed/setup.sh. The full run (50 containers, 100
cycles) takes about 15 minutes on the 2-core CI VM; integration/test_load.py runs a small one.

Usage: python3 bench/load.py [--containers 50] [--cycles 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from archive import machine

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench" / "load.json"
IMAGE = "localhost/gpuckpt-test:latest"
COUNTER = (REPO / "integration" / "workloads" / "counter.py").read_text()
RUNC_ROOT = "/run/runc"  # where podman has runc (and so the shim's runc) keep container state
STEP_TIMEOUT_S = 600


@dataclass
class Tally:
    """Failures by step, with the last words of each, shared by the threads."""

    steps: int = 0
    failures: dict[str, list[str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, step: str, problem: str | None) -> None:
        with self.lock:
            self.steps += 1
            if problem is not None:
                self.failures.setdefault(step, []).append(problem[-400:])

    def total(self) -> int:
        return sum(len(problems) for problems in self.failures.values())


def podman(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=STEP_TIMEOUT_S)


def step(tally: Tally, name: str, *argv: str) -> str | None:
    """One podman command, counted; its stdout, or None when it failed."""
    try:
        done = podman(*argv)
    except subprocess.TimeoutExpired:
        tally.count(name, f"podman {' '.join(argv[:3])} took over {STEP_TIMEOUT_S} s")
        return None
    problem = None if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()}"
    tally.count(name, problem)
    return done.stdout if problem is None else None


def counter(name: str) -> tuple[str, int, str] | None:
    """The workload's (token, count, checksum), or None while it cannot be read."""
    try:
        done = podman("exec", name, "cat", "/tmp/state")
    except subprocess.TimeoutExpired:
        return None
    parts = done.stdout.split()
    return (parts[0], int(parts[1]), parts[2]) if done.returncode == 0 and len(parts) == 3 else None


def wait_count(name: str, minimum: int, timeout_s: float = 120) -> tuple[str, int, str] | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = counter(name)
        if state is not None and state[1] >= minimum:
            return state
        time.sleep(0.3)
    return None


def verified_restore(tally: Tally, name: str) -> bool:
    """Checkpoint and restore `name`; whether it went on from its checkpoint (counted as a step)."""
    before = wait_count(name, 3)
    if before is None:
        tally.count("workload running", f"{name}: no counter to read")
        return False
    if step(tally, "checkpoint", "container", "checkpoint", name) is None:
        return False
    if step(tally, "restore", "container", "restore", name) is None:
        return False
    after = wait_count(name, before[1] + 3)
    problem = None
    if after is None:
        problem = f"{name}: the restored workload does not count on"
    elif after[0] != before[0] or after[2] != before[2] or after[2] == "CORRUPT":
        problem = f"{name}: restarted or corrupted instead of restored: {before} -> {after}"
    tally.count("restored state", problem)
    return problem is None


def run_container(tally: Tally, name: str) -> None:
    try:
        if step(tally, "run", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
                IMAGE, "python3", "-c", COUNTER) is None:
            return
        step(tally, "exec", "exec", name, "true")
        verified_restore(tally, name)
        step(tally, "stop", "stop", "-t", "2", name)
    finally:  # a run that failed may still have created the container
        step(tally, "rm", "rm", "-f", "-t", "0", name)


def lifecycle(tally: Tally, names: list[str]) -> float:
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        list(pool.map(lambda name: run_container(tally, name), names))
    return time.monotonic() - started


def cycles(tally: Tally, name: str, count: int) -> float:
    started = time.monotonic()
    try:
        if step(tally, "run", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
                IMAGE, "python3", "-c", COUNTER) is None:
            return 0.0
        for _ in range(count):
            verified_restore(tally, name)
    finally:
        step(tally, "rm", "rm", "-f", "-t", "0", name)
    return time.monotonic() - started


class LatencySampler:
    """`state` of a bystander container through the shim and through runc, interleaved, while the load runs."""

    def __init__(self, container_id: str) -> None:
        self.argvs = {"gpuckpt-runtime": ["gpuckpt-runtime", "--root", RUNC_ROOT, "state", container_id],
                      "runc": ["runc", "--root", RUNC_ROOT, "state", container_id]}
        self.samples: dict[str, list[float]] = {name: [] for name in self.argvs}
        self.failed: dict[str, int] = dict.fromkeys(self.argvs, 0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(0.2):
            for name, argv in self.argvs.items():
                started = time.perf_counter()
                done = subprocess.run(argv, capture_output=True)
                elapsed_ms = (time.perf_counter() - started) * 1000
                if done.returncode == 0:
                    self.samples[name].append(elapsed_ms)
                else:
                    self.failed[name] += 1

    def figures(self) -> dict[str, dict[str, float]]:
        def percentile(values: list[float], share: float) -> float:
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 2) if ordered else 0.0
        return {name: {"samples": len(values), "failed": self.failed[name],
                       "p50_ms": round(statistics.median(values), 2) if values else 0.0,
                       "p99_ms": percentile(values, 0.99)}
                for name, values in self.samples.items()}


def load(containers: int, cycle_count: int) -> dict:
    """Both phases with the sampler running; the figures (as load.json holds them)."""
    prefix = f"gpuckpt-load-{os.getpid()}"
    tally = Tally()
    bystander = f"{prefix}-bystander"
    podman("run", "-d", "--runtime", "gpuckpt-runtime", "--name", bystander, "--network", "none", IMAGE,
           "sleep", "3600")
    try:
        bystander_id = podman("inspect", "--format", "{{.Id}}", bystander).stdout.strip()
        sampler = LatencySampler(bystander_id)
        sampler.thread.start()
        try:
            lifecycle_s = lifecycle(tally, [f"{prefix}-{index}" for index in range(containers)])
            cycles_s = cycles(tally, f"{prefix}-cycles", cycle_count)
        finally:
            sampler.stop.set()
            sampler.thread.join()
    finally:
        podman("rm", "-f", "-t", "0", bystander)
    latency = sampler.figures()
    return {"machine": machine(), "podman": podman("--version").stdout.strip(), "containers": containers,
            "cycles": cycle_count, "lifecycle_s": round(lifecycle_s, 1), "cycles_s": round(cycles_s, 1),
            "steps": tally.steps, "failures": tally.total(), "failures_by_step": tally.failures,
            "passthrough_state_ms": latency,
            "passthrough_overhead_p50_ms": round(latency["gpuckpt-runtime"]["p50_ms"] - latency["runc"]["p50_ms"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--out", default=str(RESULTS))
    options = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("load.py: run as root")
    result = load(options.containers, options.cycles)
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(result, indent=2) + "\n")
    latency = result["passthrough_state_ms"]
    print(f"{result['containers']} containers through run/exec/checkpoint/restore/stop/rm at once: "
          f"{result['lifecycle_s']} s; {result['cycles']} verified checkpoint/restore cycles: {result['cycles_s']} s")
    print(f"steps {result['steps']}, failures {result['failures']}: {json.dumps(result['failures_by_step'])[:2000]}")
    print(f"state under load, p50/p99 ms: gpuckpt-runtime {latency['gpuckpt-runtime']['p50_ms']}/"
          f"{latency['gpuckpt-runtime']['p99_ms']}, runc {latency['runc']['p50_ms']}/{latency['runc']['p99_ms']} "
          f"({latency['gpuckpt-runtime']['samples']} samples each)")


if __name__ == "__main__":
    main()
