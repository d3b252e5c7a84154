"""Checkpoint archives: podman's own `--export`/`--import` against `gpuckpt export`/`import`.

One container holding --mib of memory (a share random, a share zero, the rest a repeated
pattern, as real heaps are) is moved four times in the same run, each restore checked to
continue from its checkpointed state (same token, counter going on):

    podman container checkpoint --export P     podman container restore --import P
    gpuckpt export -o G                         gpuckpt import G

plus podman's checkpoint and restore without an archive, for reference. Prints the figures
side by side and writes results/bench/archive.json. Run as root after integration/testbed/setup.sh.
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

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench" / "archive.json"
IMAGE = "localhost/gpuckpt-test:latest"
GOAL_RATIO = 0.25
WORKLOAD = """
import os, time
mib, random_share, zero_share = int(os.environ["MIB"]), float(os.environ["RANDOM"]), float(os.environ["ZERO"])
token = os.urandom(8).hex()
chunk = 64 << 20
memory = []
for at in range(0, mib << 20, chunk):
    part = bytearray(chunk)  # zero
    kind = (at // chunk) % 20 / 20
    if kind < random_share:
        part[:] = os.urandom(chunk)
    elif kind >= random_share + zero_share:
        part[:] = (b"gpuckpt-pattern-" + at.to_bytes(8, "little")) * (chunk // 24) + bytes(chunk % 24)
    memory.append(part)
count = 0
while True:
    count += 1
    with open("/tmp/state.new", "w") as state:
        state.write(f"{token} {count} {len(memory)}\\n")
    os.replace("/tmp/state.new", "/tmp/state")
    time.sleep(0.1)
"""


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.node()} ({os.cpu_count()} cores, {cpu}, {memory_gib:.0f} GiB, kernel {platform.release()})"


def run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def timed(*argv: str) -> float:
    started = time.monotonic()
    run(*argv)
    return time.monotonic() - started


def state(name: str) -> tuple[str, int]:
    token, count, _ = run("podman", "exec", name, "cat", "/tmp/state").split()
    return token, int(count)


def wait_state(name: str, after: int = 0, timeout_s: float = 300) -> tuple[str, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            token, count = state(name)
            if count > after:
                return token, count
        except (SystemExit, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{name}: the workload did not go on within {timeout_s} s")


def check_continues(name: str, before: tuple[str, int]) -> None:
    token, count = wait_state(name, after=before[1])
    if token != before[0]:
        raise SystemExit(f"{name}: restarted instead of restored ({before[0]} -> {token})")


def one_round(name: str, work: Path, gpuckpt: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    for label, checkpoint, restore in (
        ("podman", ["podman", "container", "checkpoint", name], ["podman", "container", "restore", name]),
        ("podman_archive", ["podman", "container", "checkpoint", "--export", str(work / "podman.tar.zst"), name],
         ["podman", "container", "restore", "--import", str(work / "podman.tar.zst")]),
        ("gpuckpt_archive", [gpuckpt, "export", name, "-o", str(work / "gpuckpt.tar.zst")],
         [gpuckpt, "import", str(work / "gpuckpt.tar.zst")]),
    ):
        before = state(name)
        run("sync")  # each starts with no dirty pages of the one before
        figures[f"{label}_checkpoint_s"] = timed(*checkpoint)
        if label != "podman":
            figures[f"{label}_bytes"] = (work / f"{label.split('_')[0]}.tar.zst").stat().st_size
            run("podman", "rm", "-f", "-t", "0", name)
        run("sync")
        figures[f"{label}_restore_s"] = timed(*restore)
        check_continues(name, before)
        for archive in work.iterdir():
            archive.unlink()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=3800, help="memory the container holds (default 3800)")
    parser.add_argument("--random", type=float, default=0.5, help="share of it that is random (default 0.5)")
    parser.add_argument("--zero", type=float, default=0.25, help="share of it that is zero (default 0.25)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--work", default="/var/tmp", help="where the archives go (default /var/tmp: a disk)")
    parser.add_argument("--out", default=str(RESULTS))
    options = parser.parse_args()
    gpuckpt = shutil.which("gpuckpt") or "/usr/local/bin/gpuckpt"
    name = f"gpuckpt-bench-archive-{os.getpid()}"
    runtime = run("podman", "info", "--format", "{{.Host.OCIRuntime.Name}}").strip()
    run("podman", "run", "-d", "--name", name, "--network", "none", "-e", f"MIB={options.mib}",
        "-e", f"RANDOM={options.random}", "-e", f"ZERO={options.zero}", IMAGE, "python3", "-c", WORKLOAD)
    rounds = []
    try:
        wait_state(name)
        with tempfile.TemporaryDirectory(dir=options.work, prefix="gpuckpt-bench-") as work:
            for _ in range(options.runs):
                rounds.append(one_round(name, Path(work), gpuckpt))
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    result = {
        "machine": machine(), "runtime": runtime, "podman": run("podman", "--version").strip(),
        "container_mib": options.mib, "random_share": options.random, "zero_share": options.zero, "runs": options.runs,
        "podman_checkpoint_s": round(median["podman_checkpoint_s"], 2),
        "podman_restore_s": round(median["podman_restore_s"], 2),
        "podman_export_s": round(median["podman_archive_checkpoint_s"], 2),
        "podman_import_s": round(median["podman_archive_restore_s"], 2),
        "gpuckpt_export_s": round(median["gpuckpt_archive_checkpoint_s"], 2),
        "gpuckpt_import_s": round(median["gpuckpt_archive_restore_s"], 2),
        "podman_bytes": int(median["podman_archive_bytes"]), "gpuckpt_bytes": int(median["gpuckpt_archive_bytes"]),
    }
    result["export_ratio"] = round(result["gpuckpt_export_s"] / result["podman_export_s"], 3)
    result["import_ratio"] = round(result["gpuckpt_import_s"] / result["podman_import_s"], 3)
    result["goals"] = {"export_ratio_at_most": GOAL_RATIO, "import_ratio_at_most": GOAL_RATIO,
                       "export_met": result["export_ratio"] <= GOAL_RATIO,
                       "import_met": result["import_ratio"] <= GOAL_RATIO,
                       "size_met": result["gpuckpt_bytes"] <= result["podman_bytes"]}
    result["rounds"] = rounds
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['machine']}; runtime {runtime}; {options.mib} MiB container; median of {options.runs}")
    print(f"{'':28}{'podman':>10}{'gpuckpt':>10}{'ratio':>8}  goal")
    print(f"{'checkpoint + archive (s)':28}{result['podman_export_s']:10.2f}{result['gpuckpt_export_s']:10.2f}"
          f"{result['export_ratio']:8.2f}  <= {GOAL_RATIO}")
    print(f"{'unpack + restore (s)':28}{result['podman_import_s']:10.2f}{result['gpuckpt_import_s']:10.2f}"
          f"{result['import_ratio']:8.2f}  <= {GOAL_RATIO}")
    print(f"{'archive (MiB)':28}{result['podman_bytes'] / 2**20:10.0f}{result['gpuckpt_bytes'] / 2**20:10.0f}"
          f"{result['gpuckpt_bytes'] / result['podman_bytes']:8.2f}  <= 1")
    print(f"{'(no archive) checkpoint (s)':28}{result['podman_checkpoint_s']:10.2f}")
    print(f"{'(no archive) restore (s)':28}{result['podman_restore_s']:10.2f}")
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
