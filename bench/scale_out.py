"""K replicas of one stored checkpoint restored at once, each onto its own device: time until every one answers.

Scale-out from one checkpoint (issue #34): a running container is checkpointed into the store once (`gpuckpt
store checkpoint --leave-running`); then for each K, K `gpuckpt store restore` run at the same moment, each with
its own name (--name), network identity (--ignore-static-ip, --ignore-static-mac) and, with --kind, device
(--gpu KIND=DEVICE, the i-th of --devices), reading the same chunks. A replica answers when --probe succeeds in
it (`podman exec NAME sh -c PROBE`). K = 1 is the baseline, measured in the same run; rounds alternate the Ks.
Prints the medians side by side; writes JSON (--out).

GPU machine: --source a CDI-started GPU container, --kind nvidia.com/gpu --devices 0,1,2,3 --counts 1,2,4.
CPU: any container of the test bed without --kind (no device moves: the store and podman's part alone).
Root, after integration/testbed/setup.sh (or the .deb) and `gpuckpt install --engine podman`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from passthrough import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench" / "scale_out.json"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"scale_out: {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return done


def one_round(options: argparse.Namespace, checkpoint: str, count: int) -> list[float]:
    """Seconds from the start until each of `count` replicas answered (in replica order)."""
    names = [f"scale-out-{count}-{index}" for index in range(count)]
    restores = []
    started = time.monotonic()
    for index, name in enumerate(names):
        argv = ["gpuckpt", "store", "restore", "--store", str(options.store), "--name", name,
                "--ignore-static-ip", "--ignore-static-mac", checkpoint]
        if options.kind:
            argv[3:3] = ["--gpu", f"{options.kind}={options.devices[index]}"]
        if options.trust_config:
            argv[3:3] = ["--trust-config"]
        restores.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    answered: list[float] = []
    try:
        for name, restore in zip(names, restores, strict=True):
            _, errors = restore.communicate(timeout=options.timeout_s)
            if restore.returncode != 0:
                raise SystemExit(f"scale_out: the restore of {name} exited {restore.returncode}: "
                                 f"{errors.strip()[-400:]}")
            deadline = started + options.timeout_s
            while subprocess.run(["podman", "exec", name, "sh", "-c", options.probe], capture_output=True).returncode:
                if time.monotonic() > deadline:
                    raise SystemExit(f"scale_out: {name} did not answer within {options.timeout_s} s")
                time.sleep(0.02)
            answered.append(time.monotonic() - started)
    finally:
        for restore in restores:
            if restore.poll() is None:
                restore.kill()
        subprocess.run(["podman", "rm", "-f", "-t", "0", *names], capture_output=True)
    return answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="", help="the running container to checkpoint once")
    parser.add_argument("--counts", default="1,2,4", help="the Ks (default 1,2,4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kind", default="", help="a CDI kind: each replica onto its own device of it (--gpu)")
    parser.add_argument("--devices", default="0,1,2,3", help="the kind's devices, the i-th replica's i-th")
    parser.add_argument("--probe", default="test -s /tmp/state", help="succeeds in a replica once it answers")
    parser.add_argument("--trust-config", action="store_true", help="passed to each restore (a CDI spec's binds)")
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--store", type=Path, default=None, help="the store (default: a new one, removed after)")
    parser.add_argument("--checkpoint", default="",
                        help="a checkpoint already in --store to restore (default: take one of --source)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    options = parser.parse_args()
    counts = [int(count) for count in options.counts.split(",")]
    options.devices = options.devices.split(",")
    if bool(options.source) == bool(options.checkpoint) or (options.checkpoint and not options.store):
        raise SystemExit("scale_out: give --source (a running container), or --checkpoint with the --store holding it")
    if options.kind and max(counts) > len(options.devices):
        raise SystemExit(f"scale_out: K = {max(counts)} needs as many --devices ({len(options.devices)} given)")
    own_store = options.store is None
    options.store = options.store or Path(tempfile.mkdtemp(prefix="scale-out-store-"))
    checkpoint = options.checkpoint or f"scale-out-{int(time.time())}"
    try:
        if not options.checkpoint:
            run("gpuckpt", "store", "checkpoint", "--store", str(options.store), "--name", checkpoint,
                "--leave-running", options.source)
        seconds: dict[int, list[list[float]]] = {count: [] for count in counts}
        for _ in range(options.rounds):
            for count in counts:
                seconds[count].append(one_round(options, checkpoint, count))
    finally:
        if own_store:
            shutil.rmtree(options.store, ignore_errors=True)
    baseline = statistics.median(max(times) for times in seconds[counts[0]])
    rows = []
    print(f"{'K':>3} {'all answering':>14} {'first':>8} {'vs K=' + str(counts[0]):>9}   (medians of {options.rounds})")
    for count in counts:
        last = statistics.median(max(times) for times in seconds[count])
        first = statistics.median(min(times) for times in seconds[count])
        rows.append({"replicas": count, "all_answering_s": round(last, 3), "first_answering_s": round(first, 3),
                     "over_baseline": round(last / baseline, 3), "rounds_s": seconds[count]})
        print(f"{count:>3} {last:>13.2f}s {first:>7.2f}s {last / baseline:>8.2f}x")
    result = {"machine": machine(), "source": options.source or checkpoint, "kind": options.kind or None,
              "devices": options.devices[:max(counts)] if options.kind else None, "probe": options.probe,
              "results": rows}
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {options.out}")


if __name__ == "__main__":
    main()
