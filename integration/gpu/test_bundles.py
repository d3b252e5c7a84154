"""GPU scenarios on runc bundles through gpuckpt-runtime: checkpoint to disk and /dev/shm, --leave-running,
several CUDA processes, a failed dump rolled back, the shim killed at each phase, the downtime beside its floor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import harness
import pytest
from harness import (
    CLI,
    COUNTER,
    RUNTIME_ROOT,
    Bundle,
    assert_continues,
    gpuckpt_python,
    image_bytes,
    log,
    machine_floors,
    manifest,
    sh,
    wait_counters,
)

pytestmark = pytest.mark.gpu


def test_disk_and_shm(results: dict) -> None:
    """Checkpoint to disk and to /dev/shm; restore; the workload verifies its GPU data and goes on."""
    for where in ("/var/tmp", "/dev/shm"):
        bundle = Bundle("basic", COUNTER, {"GIB": "2"})
        try:
            bundle.start()
            before = wait_counters(bundle, 1, 3)
            images = Path(where) / f"gpuckpt-img-{bundle.name}"
            checkpoint_s, _ = bundle.checkpoint(images)
            info = manifest(images)
            assert info["processes"] and info["gpu_handler"] == "gpuckpt", info
            restore_s = bundle.restore(images)
            after = assert_continues(bundle, before)
            key = "shm" if where == "/dev/shm" else "disk"
            results[f"basic_{key}"] = {"checkpoint_s": round(checkpoint_s, 3), "restore_s": round(restore_s, 3),
                                       "image_bytes": image_bytes(images), "before": before, "after": after,
                                       "manifest_timings": info["timings"]}
            log(f"basic {key}: checkpoint {checkpoint_s:.2f} s, restore {restore_s:.2f} s, {before} -> {after}")
            shutil.rmtree(images)
        finally:
            bundle.destroy()


def test_leave_running(results: dict) -> None:
    bundle = Bundle("live", COUNTER, {"GIB": "2"})
    images = Path("/dev/shm/gpuckpt-img-live")
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3)
        checkpoint_s, _ = bundle.checkpoint(images, "--leave-running")
        after = assert_continues(bundle, before)  # the same process goes on
        downtime = manifest(images)["timings"]["downtime_s"]
        assert downtime is not None and downtime > 0
        # and the image restores too, after the original is gone
        bundle.destroy()
        bundle.restore(images)
        assert_continues(bundle, before)
        results["leave_running"] = {"checkpoint_s": round(checkpoint_s, 3), "downtime_s": round(downtime, 3),
                                    "after": after}
        log(f"leave-running: checkpoint {checkpoint_s:.2f} s, downtime {downtime:.2f} s")
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def test_four_processes(results: dict) -> None:
    bundle = Bundle("four", COUNTER, {"GIB": "1", "PROCS": "4"})
    images = Path("/dev/shm/gpuckpt-img-four")
    try:
        bundle.start()
        before = wait_counters(bundle, 4, 3)
        checkpoint_s, _ = bundle.checkpoint(images)
        info = manifest(images)
        assert len(info["processes"]) == 4, info["processes"]
        restore_s = bundle.restore(images)
        assert_continues(bundle, before)
        results["four_processes"] = {"checkpoint_s": round(checkpoint_s, 3), "restore_s": round(restore_s, 3),
                                     "manifest_timings": info["timings"]}
        log(f"four processes: checkpoint {checkpoint_s:.2f} s, restore {restore_s:.2f} s")
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def test_failed_dump(results: dict) -> None:
    """The dump fails after the GPU was checkpointed: the shim restores and unlocks; the workload goes on."""
    bundle = Bundle("faildump", COUNTER, {"GIB": "2"})
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3)
        # CRIU cannot reach the page server it is sent to: the delegate's dump fails once the device checkpoint
        # is done (image and work directories the shim cannot make are refused before the GPU is touched)
        _, result = bundle.checkpoint(Path("/var/tmp/gpuckpt-img-faildump"), "--page-server", "127.0.0.1:1",
                                      check=False)
        assert "restored and unlocked" in result.stderr, result.stderr
        assert result.returncode != 0, "the dump should have failed"
        assert bundle.state()["status"] == "running"
        assert_continues(bundle, before)
        results["failed_dump"] = {"exit_status": result.returncode, "message": result.stderr.strip()[-400:],
                                  "workload_continued": True}
        log(f"failed dump: exit {result.returncode}, workload continued; message: {result.stderr.strip()[-200:]}")
    finally:
        bundle.destroy()
        shutil.rmtree("/var/tmp/gpuckpt-img-faildump", ignore_errors=True)


JOURNAL_DIR = Path("/var/lib/gpuckpt/journal")


def journal_phase(bundle: Bundle) -> dict:
    try:
        return json.loads((JOURNAL_DIR / f"{bundle.name}.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def kill_shim_at(bundle: Bundle, argv: list[str], phase: str, after_s: float) -> dict:
    """Start the shim on `argv`, SIGKILL it `after_s` into the journal's `phase` (as the OOM killer or
    kill -9 would); the journal it leaves."""
    with open(os.devnull, "r+b") as null:
        shim = subprocess.Popen([harness.RUNTIME, "--root", RUNTIME_ROOT, "--log", str(bundle.dir / "killed.log"),
                                 *argv], stdin=null, stdout=null, stderr=null, cwd=bundle.dir)
    deadline = time.monotonic() + 300
    def reached() -> bool:
        left = journal_phase(bundle)
        return left.get("phase") == phase and (phase not in ("dump", "restore") or bool(left.get("delegate_pid")))

    while not reached():
        assert shim.poll() is None, f"the shim ended ({shim.returncode}) before '{phase}'"
        assert time.monotonic() < deadline, f"never reached '{phase}'"
        time.sleep(0.01)
    time.sleep(after_s)
    shim.kill()
    shim.wait()
    left = journal_phase(bundle)
    assert left, "the killed shim left no journal"
    return left


def driver_states(pids: list[int]) -> dict:
    """The real driver's checkpoint state of each process, asked by a fresh process."""
    return gpuckpt_python(  # type: ignore[return-value]
        "import json; from gpuckpt.cuda.driver import load_driver; d = load_driver(); "
        f"print(json.dumps({{p: d.state(p).name for p in {pids!r}}}))")


def wait_gone(pid: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while pid and os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)


def test_killed_shim(results: dict) -> None:
    """gpuckpt-runtime SIGKILLed during the device checkpoint, the dump, the device restore of a restore and
    --leave-running's device restore, over the real driver: the next gpuckpt (recover, or the next verb)
    finishes its journal; the workload's GPU data is intact and it goes on."""
    bundle = Bundle("killed", COUNTER, {"GIB": "4"})
    images = Path("/dev/shm/gpuckpt-img-killed")
    record: dict = {}
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3)
        # 1. during the device checkpoint (4 GiB: seconds); then `gpuckpt recover`
        left = kill_shim_at(bundle, ["checkpoint", "--image-path", str(images), bundle.name], "gpu_checkpoint", 1.0)
        pids = [p["host_pid"] for p in left["processes"]]
        left_in = driver_states(pids)
        recovered = sh(CLI, "recover").stdout.strip()
        assert driver_states(pids) == {str(pid): "RUNNING" for pid in pids}, recovered
        before = assert_continues(bundle, before)
        record["device_checkpoint"] = {"left_in": left_in, "recover": recovered}
        log(f"killed during the device checkpoint: left {left_in}; {recovered}")
        shutil.rmtree(images, ignore_errors=True)
        # 2. during --leave-running's device restore; then the next checkpoint finishes it first
        left = kill_shim_at(bundle, ["checkpoint", "--image-path", str(images), "--leave-running", bundle.name],
                            "gpu_resume", 0.3)
        left_in = driver_states(pids)
        _, second = bundle.checkpoint(Path("/dev/shm/gpuckpt-img-killed-2"), "--leave-running")
        assert driver_states(pids) == {str(pid): "RUNNING" for pid in pids}
        assert manifest(images)["dump_completed"], "the first dump had completed"
        before = assert_continues(bundle, before)
        record["leave_running_device_restore"] = {"left_in": left_in, "next_checkpoint": second.stderr[-600:]}
        log(f"killed during --leave-running's device restore: left {left_in}; the next checkpoint finished it")
        shutil.rmtree("/dev/shm/gpuckpt-img-killed-2", ignore_errors=True)
        shutil.rmtree(images, ignore_errors=True)
        # 3. during the delegate's dump: it completes without the shim; the restore finishes the image first
        left = kill_shim_at(bundle, ["checkpoint", "--image-path", str(images), bundle.name], "dump", 0.0)
        wait_gone(left.get("delegate_pid", 0))
        assert manifest(images)["dump_completed"] is False
        restore_s = bundle.restore(images)
        assert manifest(images)["dump_completed"]
        before = assert_continues(bundle, before)
        record["dump"] = {"restore_s": round(restore_s, 3), "restore_said": bundle.last_messages[-600:]}
        log(f"killed during the dump: restored in {restore_s:.2f} s after the image was marked complete")
        # 4. during a restore's device restore; then `gpuckpt recover`
        shutil.rmtree(images)
        bundle.checkpoint(images)
        left = kill_shim_at(bundle, ["restore", "-d", "--bundle", str(bundle.dir), "--image-path", str(images),
                                     bundle.name], "gpu_restore", 0.3)
        pids = [p["host_pid"] for p in left["processes"]]
        left_in = driver_states(pids)
        recovered = sh(CLI, "recover").stdout.strip()
        assert driver_states(pids) == {str(pid): "RUNNING" for pid in pids}, recovered
        after = assert_continues(bundle, before)
        record["device_restore"] = {"left_in": left_in, "recover": recovered, "after": after}
        log(f"killed during a restore's device restore: left {left_in}; {recovered}")
        results["killed_shim"] = record
    finally:
        results.setdefault("killed_shim", record)
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def downtime_phases(messages: str) -> dict:
    """The shim's downtime line: total, where the dump went and each phase's seconds."""
    line = next(text for text in messages.splitlines() if "GPU downtime" in text)
    total = float(line.split("GPU downtime ")[1].split(" s")[0])
    phases = dict(part.strip().rsplit(" ", 1) for part in line.split("): ", 1)[1].rstrip('"').split(","))
    return {"downtime_s": total, "staged": "into memory" in line,
            **{name: round(float(seconds), 3) for name, seconds in phases.items()}}


def test_downtime(results: dict) -> None:
    """--leave-running of a 16 GiB CUDA process to a disk directory, its dump staged in memory
    (cuda.stage_leave_running = true) and written to disk directly (the default), in turns: the downtime beside
    its floor measured in the same run (device checkpoint + the dump + device restore), the worse of all rounds
    as `downtime_over_floor`."""
    gib = os.environ.get("DOWNTIME_GIB", "16")
    bundle = Bundle("downtime", COUNTER, {"GIB": gib})
    config = Path("/etc/gpuckpt/config.toml")
    plain = config.read_text()
    rounds: list[dict] = []
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3, timeout_s=600)
        for staged in (True, False, True, False):
            config.write_text(plain + f"[cuda]\nstage_leave_running = {str(staged).lower()}\n")
            images = Path(f"/var/tmp/gpuckpt-img-downtime-{len(rounds)}")
            checkpoint_s, result = bundle.checkpoint(images, "--leave-running")
            phases = downtime_phases(result.stderr)
            assert phases["staged"] == staged, phases
            floor = phases["device_checkpoint_s"] + phases["dump_s"] + phases["device_restore_s"]
            rounds.append({**phases, "checkpoint_s": round(checkpoint_s, 3), "floor_s": round(floor, 3),
                           "downtime_over_floor": round(phases["downtime_s"] / floor, 3),
                           "image_bytes": image_bytes(images)})
            log(f"downtime ({'staged in memory' if staged else 'dump to disk'}): {phases['downtime_s']:.2f} s, "
                f"floor {floor:.2f} s, checkpoint {checkpoint_s:.2f} s; {phases}")
            before = assert_continues(bundle, before)
            shutil.rmtree(images)
    finally:
        config.write_text(plain)
        bundle.destroy()
    staged_rounds = [r for r in rounds if r["staged"]]
    direct_rounds = [r for r in rounds if not r["staged"]]
    results["downtime"] = {
        "gib": float(gib), "rounds": rounds, **machine_floors(),
        "downtime_over_floor": max(r["downtime_over_floor"] for r in rounds),
        "staged_downtime_s": [r["downtime_s"] for r in staged_rounds],
        "direct_downtime_s": [r["downtime_s"] for r in direct_rounds],
    }
    harness.result_path("downtime").write_text(json.dumps(results["downtime"], indent=2))
