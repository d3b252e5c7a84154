"""What gpuckpt-runtime adds to podman's checkpoint and restore of a CPU-only container, and to `state`.

Three containers of the test bed's image running `sleep`: one with runc, one with gpuckpt-runtime
(delegating to runc) whose compiled launcher hands its verbs to gpuckpt-runtimed itself (started by
this bench unless systemd's socket listens), one with a Python launcher that works them in its own process
(GPUCKPT_RESIDENT=0: the shim as it ran before both), checkpointed and restored in turns, the same
number of cycles each, so load on the machine falls on all. The third is what a node without the helper
runs (no gpuckpt-runtimed.socket: the compiled launcher finds nothing listening and starts the Python shim,
which works the verb itself; this launcher skips the failed connect, microseconds). Prints one table: per
verb, runc's median and p90, the shim's through the helper and in-process, each with its added
milliseconds over runc in the same run; writes results/bench/owned_verbs.json (--machine names the machine
there, as gpuckpt doctor's figure quotes it). The pass-through's cost is
timed the same way on `state` of the shim's container (runc's root, as podman calls it), through
both launchers.
Run as root after integration/testbed/setup.sh and gpuckpt install --engine podman.
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
from passthrough import machine, time_once  # noqa: E402

from gpuckpt.shim.resident.call import helper_listens  # noqa: E402

IMAGE = "localhost/gpuckpt-test:latest"
RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench" / "owned_verbs.json"
PODMAN_RUNC_ROOT = "/run/runc"
GOAL_ADDED_MS = 50.0
# The floor of an owned verb in this design: the shim's interpreter (the launcher's, -I -S), pydantic (every
# file it writes or reads is a model) and cryptography (every dump is signed), one model built.
FLOOR_CODE = ("import pydantic, cryptography.hazmat.primitives.serialization\n"
              "class Floor(pydantic.BaseModel):\n    x: int\nFloor(x=1)\n")
GOAL_PASSTHROUGH_MS = 5.0
IN_PROCESS = "gpuckpt-runtime in-process"
RESIDENT_ENV = "GPUCKPT_RESIDENT"  # shim/resident/call.py's switch


def figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered), 1),
            "p90_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 1), "runs": len(ordered)}


def python_and_site(shim: str) -> tuple[list[str], str]:
    """The installation's interpreter (with its flags) and site-packages, read from gpuckpt-runtimed's launcher
    beside the shim (a Python one; the shim's own is compiled where the machine could build it)."""
    lines = Path(shim).with_name("gpuckpt-runtimed").read_text().splitlines()
    site = next(line.split('"')[1] for line in lines if "sys.path.insert" in line)
    return lines[0].removeprefix("#!").split(), site


def in_process_launcher(shim: str, directory: Path) -> str:
    """The shim as every call ran it before gpuckpt-runtimed and the compiled launcher: a Python launcher
    that works its verbs in its own process (GPUCKPT_RESIDENT=0)."""
    python, site = python_and_site(shim)
    copy = directory / "gpuckpt-runtime-in-process"
    copy.write_text(f"#!{' '.join(python)}\nimport os, sys\nos.environ[{RESIDENT_ENV!r}] = '0'\n"
                    f"sys.path.insert(0, {site!r})\nfrom gpuckpt.shim.main import main\nsys.exit(main())\n")
    copy.chmod(0o755)
    return str(copy)


def start_helper(shim: str) -> subprocess.Popen | None:
    """gpuckpt-runtimed beside the shim, unless one listens already (systemd's socket); None then."""
    if helper_listens():
        return None
    helper = subprocess.Popen([str(Path(shim).with_name("gpuckpt-runtimed"))])
    deadline = time.monotonic() + 30
    while not helper_listens():
        assert helper.poll() is None and time.monotonic() < deadline, "gpuckpt-runtimed did not start listening"
        time.sleep(0.1)
    return helper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--state-runs", type=int, default=100)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--machine", default="", help="a short name for the machine, written before its facts")
    options = parser.parse_args()
    podman, runc = shutil.which("podman"), shutil.which("runc")
    shim = shutil.which("gpuckpt-runtime")
    assert podman and runc and shim, "podman, runc and gpuckpt-runtime must be installed"
    scratch = Path(tempfile.mkdtemp(prefix="owned-verbs-"))
    # runc by its path: `--runtime runc` is whatever containers.conf names runc, and gpuckpt install --default has
    # the shim stand in for runc there (cli/install.py)
    runtimes = {"runc": runc, "gpuckpt-runtime": shim, IN_PROCESS: in_process_launcher(shim, scratch)}
    names = {"runc": "bench-owned-runc", "gpuckpt-runtime": "bench-owned-shim", IN_PROCESS: "bench-owned-shim-local"}
    times: dict[str, dict[str, list[float]]] = {rt: {"checkpoint": [], "restore": []} for rt in names}
    helper = start_helper(shim)
    try:
        for runtime, name in names.items():
            subprocess.run([podman, "rm", "-f", name], capture_output=True)
            subprocess.run([podman, "run", "-d", "--runtime", runtimes[runtime], "--name", name, IMAGE, "sleep",
                            "1000000"], check=True, capture_output=True)
        for _ in range(options.cycles):
            for runtime, name in names.items():
                times[runtime]["checkpoint"].append(time_once([podman, "container", "checkpoint", name]))
                times[runtime]["restore"].append(time_once([podman, "container", "restore", name]))
        python, site = python_and_site(shim)
        floor = [time_once([*python, "-c", f"import sys; sys.path.insert(0, {site!r})\n{FLOOR_CODE}"])
                 for _ in range(options.cycles)]
        bare = [time_once([*python, "-c", "pass"]) for _ in range(options.cycles)]
        # What a checkpoint through the helper cannot shed: the two delegate calls the verb's policy makes (state
        # and ps, side by side) before the dump (the compiled launcher hands the verb over without an interpreter)
        runc_id = subprocess.run([podman, "inspect", "-f", "{{.Id}}", names["runc"]], check=True,
                                 capture_output=True, text=True).stdout.strip()
        queries = {query: [time_once([runc, "--root", PODMAN_RUNC_ROOT, *argv, runc_id]) for _ in range(options.cycles)]
                   for query, argv in (("state", ["state"]), ("ps", ["ps", "--format", "json"]))}
        # What the shim loads before any work of a verb (its plugin switch as the shim sets it)
        loads = {verb: [time_once([*python, "-c", f"import os, sys; sys.path.insert(0, {site!r}); "
                                  f"os.environ['PYDANTIC_DISABLE_PLUGINS'] = '__all__'; import gpuckpt.shim.{verb}"])
                        for _ in range(options.cycles)] for verb in ("checkpoint", "restore")}
        shim_id = subprocess.run([podman, "inspect", "-f", "{{.Id}}", names["gpuckpt-runtime"]], check=True,
                                 capture_output=True, text=True).stdout.strip()
        state: dict[str, list[float]] = {"runc": [], "gpuckpt-runtime": [], IN_PROCESS: []}
        for _ in range(options.state_runs):
            for runtime, program in (("runc", runc), ("gpuckpt-runtime", shim), (IN_PROCESS, runtimes[IN_PROCESS])):
                state[runtime].append(time_once([program, "--root", PODMAN_RUNC_ROOT, "state", shim_id]))
    finally:
        for name in names.values():
            subprocess.run([podman, "rm", "-f", name], capture_output=True)
        if helper is not None:
            helper.terminate()
            helper.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    facts = machine()
    result: dict = {"machine": f"{options.machine}: {facts}" if options.machine else facts, "cycles": options.cycles,
                    "image": IMAGE, "workload": "sleep"}
    for verb in ("checkpoint", "restore"):
        result[verb] = {runtime: figures(times[runtime][verb]) for runtime in names}
        result[f"{verb}_added_ms"] = round(result[verb]["gpuckpt-runtime"]["median_ms"]
                                           - result[verb]["runc"]["median_ms"], 1)
        result[f"{verb}_added_in_process_ms"] = round(result[verb][IN_PROCESS]["median_ms"]
                                                      - result[verb]["runc"]["median_ms"], 1)
    result["helper"] = ("gpuckpt-runtimed started by this bench" if helper is not None
                        else "gpuckpt-runtimed already listening (systemd's socket)")
    result["state"] = {runtime: figures(samples) for runtime, samples in state.items()}
    result["floor"] = {"what": "the shim's interpreter importing pydantic and cryptography and building one model",
                       **figures(floor)}
    result["interpreter"] = {"what": "the launcher's interpreter starting and ending (-I -S), nothing imported",
                             **figures(bare)}
    result["resident_floor"] = {
        "what": "per podman checkpoint through the helper: the policy's own delegate calls (runc state and runc ps, "
                "run side by side) besides the dump",
        "runc_state_ms": figures(queries["state"])["median_ms"], "runc_ps_ms": figures(queries["ps"])["median_ms"]}
    result["imports"] = {verb: {"what": f"the interpreter importing gpuckpt.shim.{verb} (its models built)",
                                **figures(samples)} for verb, samples in loads.items()}
    result["passthrough_added_ms"] = round(result["state"]["gpuckpt-runtime"]["median_ms"]
                                           - result["state"]["runc"]["median_ms"], 1)
    result["goals"] = {"checkpoint_added_ms": GOAL_ADDED_MS, "restore_added_ms": GOAL_ADDED_MS,
                       "passthrough_added_ms": GOAL_PASSTHROUGH_MS}
    print(f"{'median (p90) ms':<12}{'runc':>16}{'shim, helper':>18}{'added':>9}{'shim, in-process':>20}{'added':>9}")
    for key in ("checkpoint", "restore", "state"):
        row = result[key]
        cells = [f"{row[runtime]['median_ms']:.1f} ({row[runtime]['p90_ms']:.0f})" for runtime in names]
        runc_ms = row["runc"]["median_ms"]
        added = [f"{row[runtime]['median_ms'] - runc_ms:+.1f}" for runtime in ("gpuckpt-runtime", IN_PROCESS)]
        print(f"{key:<12}{cells[0]:>16}{cells[1]:>18}{added[0]:>9}{cells[2]:>20}{added[1]:>9}")
    print(f"floor (interpreter + pydantic + cryptography + one model): median {result['floor']['median_ms']} ms; "
          f"interpreter alone {result['interpreter']['median_ms']} ms; importing the verb's module: checkpoint "
          f"{result['imports']['checkpoint']['median_ms']} ms, restore {result['imports']['restore']['median_ms']} ms")
    floor = result["resident_floor"]
    print(f"through the helper, per checkpoint: runc state {floor['runc_state_ms']} ms and runc ps "
          f"{floor['runc_ps_ms']} ms, side by side")
    print(f"added: checkpoint {result['checkpoint_added_ms']} ms, restore {result['restore_added_ms']} ms, "
          f"pass-through {result['passthrough_added_ms']} ms (goals {GOAL_ADDED_MS:g}, {GOAL_ADDED_MS:g}, "
          f"{GOAL_PASSTHROUGH_MS:g})")
    options.out.parent.mkdir(exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
