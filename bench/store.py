"""The checkpoint store (#18): what a second checkpoint adds, and its speed against `gpuckpt export`/`import`.

One podman container holds --mib of state (random bytes by default: nothing for compression to hide)
and rewrites --change of it (4 MiB stretches at random places) when sent SIGUSR1. In one run:

    round 1   gpuckpt store checkpoint --leave-running     gpuckpt export --leave-running -o A1
    (SIGUSR1: 10 % of the state rewritten)
    round 2   gpuckpt export --leave-running -o A2           gpuckpt store checkpoint --leave-running
    restore   gpuckpt import A2   /   gpuckpt store restore (round 2), each checked to go on, --runs times

and prints the second checkpoint's new bytes over the first's (goal <= 0.15), the store's checkpoint
time over export's (goal <= 1.0, each round) and the store's restore over import's (goal <= 1.1), and
writes results/bench/store.json. Run as root after integration/testbed/setup.sh; the gpuckpt on PATH
is used for both sides. The container runs through a gpuckpt-runtime of the run's own (a wrapper of
that name reading a config of its own, delegate runc): on a machine shared with other tests,
/etc/gpuckpt/config.toml may name another delegate from one minute to the next. Its config.dump then
names the runtime by path, so both restores take --trust-config.
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

from archive import machine, run  # the archive benchmark's helpers

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench" / "store.json"
IMAGE = "localhost/gpuckpt-test:latest"
GOALS = {"second_new_over_first": 0.15, "checkpoint_ratio": 1.0, "restore_ratio": 1.1}
WORKLOAD = """
import os, random, signal, time
mib, random_share, change = int(os.environ["MIB"]), float(os.environ["RANDOM_SHARE"]), float(os.environ["CHANGE"])
token = os.urandom(8).hex()
part_bytes, stretch = 64 << 20, 4 << 20
memory = []
for at in range(0, mib << 20, part_bytes):
    part = bytearray(part_bytes)  # zero
    if (at // part_bytes) % 20 < random_share * 20:
        part[:] = os.urandom(part_bytes)
    memory.append(part)
generation = 0

def rewrite(signum, frame):
    global generation
    rng = random.Random()
    for _ in range(int(mib * change) // 4):  # stretches of 4 MiB, anywhere
        part = rng.choice(memory)
        at = rng.randrange(0, part_bytes - stretch) // 4096 * 4096
        part[at:at + stretch] = os.urandom(stretch)
    generation += 1

signal.signal(signal.SIGUSR1, rewrite)
count = 0
while True:
    count += 1
    with open("/tmp/state.new", "w") as state:
        state.write(f"{token} {count} {generation}\\n")
    os.replace("/tmp/state.new", "/tmp/state")
    time.sleep(0.1)
"""


def state(name: str) -> tuple[str, int, int]:
    token, count, generation = run("podman", "exec", name, "cat", "/tmp/state").split()
    return token, int(count), int(generation)


def wait_state(name: str, after: int = 0, generation: int = 0, timeout_s: float = 600) -> tuple[str, int, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            now = state(name)
            if now[1] > after and now[2] >= generation:
                return now
        except (SystemExit, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{name}: the workload did not go on within {timeout_s} s")


def timed(*argv: str) -> float:
    run("sync")  # each starts with no dirty pages of the one before
    started = time.monotonic()
    run(*argv)
    return time.monotonic() - started


def restored_goes_on(name: str, before: tuple[str, int, int]) -> None:
    token, _, generation = wait_state(name, after=before[1])
    if (token, generation) != (before[0], before[2]):
        raise SystemExit(f"{name}: not the checkpointed workload after the restore ({before} -> {token} {generation})")


def own_runtime(work: Path) -> str:
    """gpuckpt-runtime reading a config of this run's own (delegate runc), whatever the node's says meanwhile."""
    config, wrapper = work / "config.toml", work / "runtime" / "gpuckpt-runtime"
    config.write_text('delegate = "runc"\n')
    config.chmod(0o644)
    wrapper.parent.mkdir()
    runtime = shutil.which("gpuckpt-runtime") or "/usr/local/bin/gpuckpt-runtime"
    wrapper.write_text(f'#!/bin/sh\nGPUCKPT_CONFIG={config} exec {runtime} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=2048, help="state the container holds (default 2048)")
    parser.add_argument("--random", type=float, default=1.0, help="share of it that is random, the rest zero")
    parser.add_argument("--change", type=float, default=0.10, help="share rewritten between checkpoints (0.10)")
    parser.add_argument("--runs", type=int, default=2, help="restores of each kind (median)")
    parser.add_argument("--work", default="/var/tmp", help="where the store and archives go (default /var/tmp)")
    parser.add_argument("--out", default=str(RESULTS))
    options = parser.parse_args()
    gpuckpt = shutil.which("gpuckpt") or "/usr/local/bin/gpuckpt"
    name = f"store-bench-{os.getpid()}"
    figures: dict[str, float] = {}
    restores: dict[str, list[float]] = {"import": [], "store": []}
    with tempfile.TemporaryDirectory(dir=options.work, prefix="gpuckpt-bench-store-") as work_dir:
        work, store_dir = Path(work_dir), str(Path(work_dir) / "store")
        in_store = (gpuckpt, "store")
        where = ("--store", store_dir)
        run("podman", "run", "-d", "--name", name, "--runtime", own_runtime(work), "--network", "none",
            "-e", f"MIB={options.mib}", "-e", f"RANDOM_SHARE={options.random}", "-e", f"CHANGE={options.change}",
            IMAGE, "python3", "-c", WORKLOAD)
        try:
            wait_state(name)
            figures["store_checkpoint_1_s"] = timed(*in_store, "checkpoint", "--leave-running", "--name", "round-1",
                                                    name, *where)
            figures["export_1_s"] = timed(gpuckpt, "export", "--leave-running", name, "-o",
                                          str(work / "round-1.tar.zst"))
            run("podman", "kill", "--signal", "USR1", name)
            wait_state(name, generation=1)
            seen = {"import": state(name)}  # the workload as each checkpoint of round 2 finds it, or later
            figures["export_2_s"] = timed(gpuckpt, "export", "--leave-running", name, "-o",
                                          str(work / "round-2.tar.zst"))
            seen["store"] = state(name)
            figures["store_checkpoint_2_s"] = timed(*in_store, "checkpoint", "--leave-running", "--name", "round-2",
                                                    name, *where)
            for _ in range(options.runs):
                for kind, argv in (("import", (gpuckpt, "import", "--trust-config", str(work / "round-2.tar.zst"))),
                                   ("store", (*in_store, "restore", "--trust-config", "round-2", *where))):
                    run("podman", "rm", "-f", "-t", "0", name)
                    restores[kind].append(timed(*argv))
                    restored_goes_on(name, seen[kind])
            shown = json.loads(run(*in_store, "show", "--json", *where))
            archive_bytes = {round_: (work / f"{round_}.tar.zst").stat().st_size for round_ in ("round-1", "round-2")}
        finally:
            subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
    rows = {row["name"]: row for row in shown["checkpoints"]}
    result: dict = {
        "machine": machine() + "; shared with other sessions' tests while it ran",
        "runtime": "gpuckpt-runtime (the run's own config: delegate runc)",
        "podman": run("podman", "--version").strip(), "state_mib": options.mib, "random_share": options.random,
        "changed_share": options.change, "restore_runs": options.runs,
        "first_new_bytes": rows["round-1"]["new_bytes"], "second_new_bytes": rows["round-2"]["new_bytes"],
        "first_logical_bytes": rows["round-1"]["logical_bytes"],
        "second_new_stored_bytes": rows["round-2"]["new_stored_bytes"],
        "store_stored_bytes": shown["stored_bytes"], "archive_bytes": archive_bytes,
        **{key: round(value, 2) for key, value in figures.items()},
        "import_restore_s": round(statistics.median(restores["import"]), 2),
        "store_restore_s": round(statistics.median(restores["store"]), 2),
        "restores": {kind: [round(value, 2) for value in values] for kind, values in restores.items()},
    }
    result["second_new_over_first"] = round(result["second_new_bytes"] / result["first_new_bytes"], 4)
    result["checkpoint_ratio_1"] = round(figures["store_checkpoint_1_s"] / figures["export_1_s"], 3)
    result["checkpoint_ratio_2"] = round(figures["store_checkpoint_2_s"] / figures["export_2_s"], 3)
    result["restore_ratio"] = round(result["store_restore_s"] / result["import_restore_s"], 3)
    result["goals"] = {**{f"{key}_at_most": value for key, value in GOALS.items()},
                       "second_new_met": result["second_new_over_first"] <= GOALS["second_new_over_first"],
                       "checkpoint_met": max(result["checkpoint_ratio_1"], result["checkpoint_ratio_2"])
                       <= GOALS["checkpoint_ratio"],
                       "restore_met": result["restore_ratio"] <= GOALS["restore_ratio"]}
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(result, indent=2) + "\n")
    mib = 2**20
    print(f"{result['machine']}; {result['runtime']}; {options.mib} MiB of state, {options.change:.0%} rewritten")
    print(f"second checkpoint's new bytes / first's: {result['second_new_bytes'] / mib:.0f} / "
          f"{result['first_new_bytes'] / mib:.0f} MiB = {result['second_new_over_first']:.3f}  (goal <= 0.15)")
    print(f"{'':30}{'export':>10}{'store':>10}{'ratio':>8}  goal")
    for round_ in (1, 2):
        print(f"{f'checkpoint, round {round_} (s)':30}{figures[f'export_{round_}_s']:10.2f}"
              f"{figures[f'store_checkpoint_{round_}_s']:10.2f}{result[f'checkpoint_ratio_{round_}']:8.2f}  <= 1.0")
    print(f"{'restore (s), median':30}{result['import_restore_s']:10.2f}{result['store_restore_s']:10.2f}"
          f"{result['restore_ratio']:8.2f}  <= 1.1")
    print(f"archives {archive_bytes['round-1'] / mib:.0f} + {archive_bytes['round-2'] / mib:.0f} MiB; "
          f"the store holds both in {result['store_stored_bytes'] / mib:.0f} MiB")
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
