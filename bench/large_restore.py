"""podman's restore of a container holding GiBs of memory: runc, gpuckpt-runtime, and runc with `--keep`.

After a successful restore podman removes the checkpoint before it returns, and freeing a
multi-GB pages image is a large share of the restore (host/deferred_free.py). Three containers
of the test bed's image hold --gib GiB of touched memory each: one with runc, one with
gpuckpt-runtime (through gpuckpt-runtimed, started here unless systemd's socket listens), and
one with runc restored with `--keep` (podman removes nothing: the floor for the first two).
Checkpointed and restored in turns, the same number of cycles each. Prints medians side by side;
writes results/bench/large_restore.json.
Run as root after integration/testbed/setup.sh and gpuckpt install --engine podman.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from owned_verbs import IMAGE, figures, start_helper  # noqa: E402
from passthrough import machine, time_once  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench" / "large_restore.json"
HOLD = ("import time\nb = bytearray({size})\nfor i in range(0, len(b), 4096):\n    b[i] = 1\n"
        "print('ready', flush=True)\ntime.sleep(10**6)\n")


def start(podman: str, runtime: str, name: str, gib: float) -> None:
    subprocess.run([podman, "rm", "-f", name], capture_output=True)
    subprocess.run([podman, "run", "-d", "--runtime", runtime, "--name", name, IMAGE, "python3", "-c",
                    HOLD.format(size=int(gib * (1 << 30)))], check=True, capture_output=True)
    deadline = time.monotonic() + 120
    while "ready" not in subprocess.run([podman, "logs", name], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, f"{name} never filled its memory"
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    options = parser.parse_args()
    podman, shim, runc = shutil.which("podman"), shutil.which("gpuckpt-runtime"), shutil.which("runc")
    assert podman and runc and shim, "podman, runc and gpuckpt-runtime must be installed"
    # runc by its path: under `gpuckpt install --engine podman --default` podman's name "runc" is the shim
    columns = {"runc": (runc, "bench-large-runc", []), "gpuckpt-runtime": (shim, "bench-large-shim", []),
               "runc, restore --keep": (runc, "bench-large-keep", ["--keep"])}
    times: dict[str, dict[str, list[float]]] = {column: {"checkpoint": [], "restore": []} for column in columns}
    helper = start_helper(shim)
    try:
        for runtime, name, _ in columns.values():
            start(podman, runtime, name, options.gib)
        for _ in range(options.cycles):
            for column, (_, name, restore_flags) in columns.items():
                times[column]["checkpoint"].append(time_once([podman, "container", "checkpoint", name]))
                times[column]["restore"].append(time_once([podman, "container", "restore", *restore_flags, name]))
    finally:
        for _, name, _ in columns.values():
            subprocess.run([podman, "rm", "-f", name], capture_output=True)
        if helper is not None:
            helper.terminate()
            helper.wait()
    result: dict = {"machine": machine(), "cycles": options.cycles, "image": IMAGE,
                    "workload": f"python3 holding {options.gib:g} GiB of touched memory"}
    for verb in ("checkpoint", "restore"):
        result[verb] = {column: figures(times[column][verb]) for column in columns}
    restore = result["restore"]
    result["restore_shim_over_runc"] = round(restore["gpuckpt-runtime"]["median_ms"] / restore["runc"]["median_ms"], 2)
    result["removal_in_runc_restore_ms"] = round(restore["runc"]["median_ms"]
                                                 - restore["runc, restore --keep"]["median_ms"], 1)
    for verb in ("checkpoint", "restore"):
        print(f"{verb:<10} " + "   ".join(f"{column} median {result[verb][column]['median_ms']:7.1f} ms "
                                         f"p90 {result[verb][column]['p90_ms']:7.1f}" for column in columns))
    print(f"restore: gpuckpt-runtime over runc {result['restore_shim_over_runc']}; podman's removal of the "
          f"checkpoint in runc's restore {result['removal_in_runc_restore_ms']} ms")
    options.out.parent.mkdir(exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
