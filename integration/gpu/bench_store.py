"""The checkpoint store (#18) on the GPU machine, through podman and gpuckpt-runtime.

1. Inference-like: one CUDA process holding GIB of weights that never change, checkpointed into the
   store twice (--leave-running, as periodic checkpoints are): the second's new bytes over the
   first's (goal <= 0.10); `gpuckpt export --leave-running` of the same container in the same run
   as the time baseline; then restored from the store and checked to go on with its device data intact.
2. Replicas: one container of 4 CUDA processes holding the same GIB of weights each (SEED: as
   data-parallel ranks do) checkpointed into the store: the bytes it stored over the sum of the four
   (the checkpoint's logical size; goal <= 0.4); restored from the store, all four going on intact.
Writes OUT/store.json with `second_new_over_first` and `replicas_stored_over_sum`.
Usage (root, repository root, after `bash integration/gpu/pack-carry.sh podman`):
    python3 integration/gpu/bench_store.py OUT_DIR [GIB [inference|replicas ...]]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
from harness import CLI, assert_continues, install, log, sh, wait_counters  # noqa: E402

COUNTER = ["python3", "/work/gpu_counter.py"]
STORE = Path("/var/tmp/gpuckpt-store-bench")  # a disk, as /var/lib/gpuckpt/store is
GOALS = {"second_new_over_first": 0.10, "replicas_stored_over_sum": 0.4}


def store(podman: harness.Podman, *argv: str) -> tuple[float, str]:
    started = time.monotonic()
    done = sh(CLI, "store", *argv, "--store", str(STORE), env=podman.env)
    return time.monotonic() - started, done.stdout.strip()


def shown(podman: harness.Podman) -> dict[str, dict]:
    rows = json.loads(sh(CLI, "store", "show", "--json", "--store", str(STORE), env=podman.env).stdout)
    return {row["name"]: row for row in rows["checkpoints"]}


def gpu_container(podman: harness.Podman, name: str, env: dict[str, str]) -> harness.StateDir:
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    podman.cli("run", "-d", "--name", name, *podman.RUN_FLAGS,
               *harness.gpu_run_args(COUNTER, {"STATE": "/state/state", **env}, state.directory, podman.IMAGE))
    return state


def inference(podman: harness.Podman, gib: str) -> dict:
    name = f"store-gpu-inference-{os.getpid()}"
    archive = Path("/var/tmp") / f"{name}.tar.zst"
    try:
        state = gpu_container(podman, name, {"GIB": gib})
        wait_counters(state, 1, 3)
        first_s, first_line = store(podman, "checkpoint", "--leave-running", "--name", "inference-1", name)
        sh("sync")
        started = time.monotonic()
        sh(CLI, "export", "--leave-running", name, "-o", str(archive), env=podman.env)
        export_s = time.monotonic() - started
        sh("sync")
        second_s, second_line = store(podman, "checkpoint", "--leave-running", "--name", "inference-2", name)
        rows = shown(podman)
        before = wait_counters(state, 1, 3)
        stop_s, _ = store(podman, "checkpoint", "--name", "inference-3", name)  # stops it: restored below
        podman.cli("rm", "-f", name)
        restore_s, restore_line = store(podman, "restore", "--trust-config", "inference-3")  # it binds host dirs
        after = assert_continues(state, before)
        found = {"gib": float(gib), "first": rows["inference-1"], "second": rows["inference-2"],
                 "store_checkpoint_1_s": round(first_s, 2), "store_checkpoint_2_s": round(second_s, 2),
                 "export_s": round(export_s, 2), "archive_bytes": archive.stat().st_size,
                 "store_checkpoint_stop_s": round(stop_s, 2), "store_restore_s": round(restore_s, 2),
                 "before": before, "after": after, "lines": [first_line, second_line, restore_line]}
        found["second_new_over_first"] = round(rows["inference-2"]["new_bytes"] / rows["inference-1"]["new_bytes"], 4)
        found["checkpoint_2_over_export"] = round(second_s / export_s, 3)
        log(f"inference: new bytes {rows['inference-1']['new_bytes'] / 2**30:.2f} then "
            f"{rows['inference-2']['new_bytes'] / 2**30:.3f} GiB ({found['second_new_over_first']}); store "
            f"{first_s:.1f} s / {second_s:.1f} s, export {export_s:.1f} s; restore {restore_s:.1f} s, "
            f"{before} -> {after}")
        return found
    finally:
        podman.cli("rm", "-f", "-t", "0", name, check=False)
        archive.unlink(missing_ok=True)
        archive.with_name(archive.name + ".sig").unlink(missing_ok=True)


def replicas(podman: harness.Podman, gib: str) -> dict:
    name = f"store-gpu-replicas-{os.getpid()}"
    try:
        state = gpu_container(podman, name, {"GIB": gib, "PROCS": "4", "SEED": "7"})
        before = wait_counters(state, 4, 3)
        checkpoint_s, line = store(podman, "checkpoint", "--name", "replicas", name)
        row = shown(podman)["replicas"]
        podman.cli("rm", "-f", name)
        restore_s, _ = store(podman, "restore", "--trust-config", "replicas")
        after = assert_continues(state, before)
        found = {"gib_each": float(gib), "processes": 4, "checkpoint": row, "before": before, "after": after,
                 "store_checkpoint_s": round(checkpoint_s, 2), "store_restore_s": round(restore_s, 2), "line": line}
        found["replicas_stored_over_sum"] = round(row["new_bytes"] / row["logical_bytes"], 4)
        found["replicas_on_disk_over_sum"] = round(row["new_stored_bytes"] / row["logical_bytes"], 4)
        log(f"replicas: {row['logical_bytes'] / 2**30:.2f} GiB of checkpoint stored as {row['new_bytes'] / 2**30:.2f} "
            f"GiB ({found['replicas_stored_over_sum']}); restore {restore_s:.1f} s, all four intact")
        return found
    finally:
        podman.cli("rm", "-f", "-t", "0", name, check=False)


def main() -> int:
    out = Path(sys.argv[1])
    gib = sys.argv[2] if len(sys.argv) > 2 else "2"
    chosen = sys.argv[3:] or ["inference", "replicas"]
    harness.OUT = out
    facts = install()
    podman = harness.Podman()
    podman.import_rootfs()
    shutil.rmtree(STORE, ignore_errors=True)
    result: dict = {"machine": facts["nvidia_smi"], "facts": facts, "store": str(STORE), "goals": GOALS}
    failed = []
    for key, run in (("inference", inference), ("replicas", replicas)):
        if key not in chosen:
            continue
        log(f"--- {key}")
        try:
            with harness.nftables_network_lock():  # podman gives the container a netns; no iptables there
                result[key] = run(podman, gib)
        except Exception as error:  # record and go on: one call brings back every result
            failed.append(key)
            result[key] = {"error": f"{type(error).__name__}: {error}"[-2000:]}
        (out / "store.json").write_text(json.dumps(result, indent=2))
    result["second_new_over_first"] = result.get("inference", {}).get("second_new_over_first")
    result["replicas_stored_over_sum"] = result.get("replicas", {}).get("replicas_stored_over_sum")
    verified = sh(CLI, "store", "verify", "--store", str(STORE), env=podman.env, check=False)
    result["verify"] = (verified.stdout + verified.stderr).strip()[-1000:]
    (out / "store.json").write_text(json.dumps(result, indent=2))
    shutil.rmtree(STORE, ignore_errors=True)
    print(f"{len(chosen) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
