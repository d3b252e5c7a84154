"""GPU checkpoint/restore tests through gpuckpt-runtime, run on the GPU machine in one call.

Each scenario asserts that the workload continues from its checkpointed state
(same token, counter going on, device data checksum intact) and records figures.
Usage (root, repository root): python3 integration/gpu/run_tests.py OUT_DIR [scenario ...]
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import cold_vs_restore  # noqa: E402
import harness  # noqa: E402
from harness import (  # noqa: E402
    CLI,
    RUNTIME_ROOT,
    TORCH_PYTHON,
    Bundle,
    assert_continues,
    image_bytes,
    install,
    log,
    manifest,
    nvidia_devices,
    sh,
    wait_counters,
)

COUNTER = ["python3", "/work/gpu_counter.py"]


def scenario_disk_and_shm(results: dict) -> str | None:
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


def scenario_leave_running(results: dict) -> str | None:
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


def scenario_four_processes(results: dict) -> str | None:
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


def scenario_failed_dump(results: dict) -> str | None:
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


def scenario_killed_shim(results: dict) -> str | None:
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


def scenario_downtime(results: dict) -> str | None:
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
    (harness.OUT / "downtime.json").write_text(json.dumps(results["downtime"], indent=2))  # type: ignore[operator]


def machine_floors() -> dict:
    """The machine and the floors under the phases on it, measured once the workload has left the GPU: the
    bus for the device phases, the disk under /var/tmp (where the images and archives go) for the write."""
    return {"machine": harness.sh("nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader").stdout.strip(),
            "copy_floor": harness.copy_floor(), "disk_floor": cold_vs_restore.disk_floor(Path("/var/tmp"))}


class LongestPause:
    """The longest time the workload's counter stood still while the block ran: the downtime it saw (to the
    counter's 0.1 s tick), whoever stopped it."""

    def __init__(self, state: harness.StateDir) -> None:
        self.state, self.longest_s, self._running = state, 0.0, False

    def __enter__(self) -> LongestPause:
        self._running = True
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        last, changed = None, time.monotonic()
        while self._running:
            now, fields = time.monotonic(), self.state.read("state.0").split()
            counter = fields[1] if len(fields) == 3 else last
            if counter != last:
                last, changed = counter, now
            self.longest_s = max(self.longest_s, now - changed)
            time.sleep(0.01)

    def __exit__(self, *_exc: object) -> None:
        time.sleep(0.5)  # a tick after the end, so the last pause is closed by a change
        self._running = False
        self._thread.join()


@harness.nftables_network_lock()
def scenario_podman_leave_running_export(results: dict) -> str | None:
    """The GPU downtime of `gpuckpt export --leave-running` beside podman's own `container checkpoint
    --leave-running --export` (through the shim, uncompressed) of the same container, in turns: as the
    workload saw it (its counter standing still) and as the shim timed it (lock to unlock)."""
    podman = harness.Podman()
    name = f"gpu-lr-export-{os.getpid()}"
    gib = os.environ.get("DOWNTIME_GIB", "16")
    rounds: list[dict] = []
    try:
        podman.import_rootfs()
        state = gpu_container(podman, name, {"GIB": gib})
        before = wait_counters(state, 1, 3, timeout_s=600)
        for way in ("gpuckpt", "podman", "podman", "gpuckpt"):
            archive = Path("/var/tmp") / f"{name}-{len(rounds)}.tar{'.zst' if way == 'gpuckpt' else ''}"
            with LongestPause(state) as pause:
                started = time.monotonic()
                if way == "gpuckpt":
                    sh(CLI, "export", "--leave-running", name, "-o", str(archive), env=podman.env)
                else:
                    podman.cli("container", "checkpoint", "--leave-running", "--export", str(archive),
                               "--compress", "none", name)
                total_s = time.monotonic() - started
            inspected = sh(CLI, "inspect", "--json", str(archive), env=podman.env, check=False)
            timings = json.loads(inspected.stdout)["manifest"]["timings"] if inspected.returncode == 0 else {
                "inspect_error": inspected.stderr.strip()[-300:]}
            rounds.append({"way": way, "total_s": round(total_s, 3), "workload_pause_s": round(pause.longest_s, 3),
                           "shim_downtime_s": timings.get("downtime_s"), "timings": timings,
                           "archive_bytes": archive.stat().st_size})
            log(f"{way} --leave-running export: {total_s:.2f} s, workload paused {pause.longest_s:.2f} s, "
                f"shim's downtime {timings.get('downtime_s')}")
            before = assert_continues(state, before)
            archive.unlink()
            Path(f"{archive}.sig").unlink(missing_ok=True)
    finally:
        podman.cli("rm", "-f", name, check=False)
    paused = {way: [r["workload_pause_s"] for r in rounds if r["way"] == way] for way in ("gpuckpt", "podman")}
    results["podman_leave_running_export"] = {
        "gib": float(gib), "rounds": rounds, **machine_floors(),
        "gpuckpt_over_podman_downtime": round(sum(paused["gpuckpt"]) / sum(paused["podman"]), 3)}
    (harness.OUT / "leave_running_export.json").write_text(  # type: ignore[operator]
        json.dumps(results["podman_leave_running_export"], indent=2))


def bit_exact_training(results: dict, key: str, script: str, env: dict[str, str], steps: int = 300,
                       gpu_minors: list[int] = [0], network: bool = False) -> None:
    """A training loop checkpointed mid-run, killed by the dump, restored and run to the end must
    end with the same weights as an uninterrupted run of the same script, bit for bit."""
    reference_dir = Path(f"/tmp/gpuckpt-{key}-ref")
    reference_dir.mkdir(exist_ok=True)
    common = {"STEPS": str(steps), "CUBLAS_WORKSPACE_CONFIG": ":4096:8", **env}
    started = time.monotonic()
    sh(TORCH_PYTHON, str(Path(__file__).parent / script), cwd=str(Path(__file__).parent), timeout=600,
       env=dict(os.environ, **common, STATE=str(reference_dir / "state"), RESULT=str(reference_dir / "result")))
    reference_s = time.monotonic() - started
    reference = (reference_dir / "result").read_text().strip()
    bundle = Bundle(key.replace("_", "-"), ["python3", f"/work/{script}"],
                    {**common, "PAUSE_AT": "60", "STATE": "/tmp/train_state", "RESULT": "/tmp/train_result"},
                    gpu_minors=gpu_minors, own_network=network)
    tcp = ("--tcp-established",) if network else ()
    images = Path(f"/dev/shm/gpuckpt-img-{key}")
    try:
        bundle.start()
        deadline = time.monotonic() + 300
        while not bundle.read("train_state").strip() or int(bundle.read("train_state")) < 80:
            assert time.monotonic() < deadline, "training did not reach step 80"
            time.sleep(0.1)
        processes = len(harness.descendants_of(bundle))
        checkpoint_s, checkpointed = bundle.checkpoint(images, *tcp)  # the dump ends the processes: "killed"
        step_at_checkpoint = int(bundle.read("train_state"))
        info = manifest(images)
        if network:
            bundle.renew_netns()
        restore_s = bundle.restore(images, *tcp)
        deadline = time.monotonic() + 600
        while not bundle.read("train_result").strip():
            assert time.monotonic() < deadline, "restored training did not finish"
            time.sleep(0.2)
        restored = bundle.read("train_result").strip()
        results[key] = {"steps": steps, "env": env, "processes_in_container": processes,
                        "cuda_processes": len(info["processes"]), "checkpointed_at_step": step_at_checkpoint,
                        "manifest_timings": info["timings"], "restore_log": bundle.last_messages.strip()[-600:],
                        "checkpoint_s": round(checkpoint_s, 3), "restore_s": round(restore_s, 3),
                        "reference_run_s": round(reference_s, 1), "criu_config": info["criu_config"],
                        "shim_log": [line[-400:] for line in checkpointed.stderr.splitlines()
                                     if "forked" in line or "link-remap" in line or "ghost" in line],
                        "reference_sha256": reference, "restored_sha256": restored, "bit_exact": restored == reference}
        log(f"{key}: {processes} processes, checkpoint at step {step_at_checkpoint} ({checkpoint_s:.2f} s), "
            f"restore {restore_s:.2f} s, bit exact: {restored == reference}; {results[key]['shim_log']}")
        assert restored == reference, "final weights differ from the uninterrupted run"
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def scenario_training_bit_exact(results: dict) -> str | None:
    """A plain training loop (data made on the GPU)."""
    bit_exact_training(results, "training", "train.py", {})


def scenario_dataloader_fork(results: dict) -> str | None:
    """The common loop: DataLoader(num_workers=2, pin_memory=True), workers forked after CUDA init
    (they hold the driver's descriptors and mappings, the driver does not know them)."""
    bit_exact_training(results, "dataloader_fork", "train_loader.py", {"WORKERS": "2", "PIN_MEMORY": "1"})


def scenario_dataloader_spawn(results: dict) -> str | None:
    """The same loop with spawned workers: multiprocessing's named semaphores need CRIU's link-remap."""
    bit_exact_training(results, "dataloader_spawn", "train_loader.py",
                       {"WORKERS": "2", "PIN_MEMORY": "1", "START_METHOD": "spawn"})


def scenario_compiled(results: dict) -> str | None:
    """The DataLoader loop with torch.compile: inductor's compile workers beside the forked data workers."""
    bit_exact_training(results, "compiled", "train_loader.py", {"WORKERS": "2", "PIN_MEMORY": "1", "COMPILE": "1"})


def scenario_late_driver(results: dict) -> str | None:
    """A process that begins using CUDA while its container is being checkpointed (late_cuda.py's watcher, as a
    compile pool waking up): the first dump fails on it, the checkpoint is rolled back and taken again with it as
    a CUDA process, and after the restore both processes go on with their device data intact."""
    podman = harness.Podman()
    name = f"gpu-late-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    try:
        with harness.nftables_network_lock(), harness.resident_helper(harness.OUT / "runtimed.log"):
            podman.import_rootfs()
            podman.cli("run", "-d", "--name", name, *podman.RUN_FLAGS,
                       *harness.gpu_run_args(["python3", "/work/late_cuda.py"], {"STATE": "/state/state"},
                                             state.directory, podman.IMAGE))
            before = wait_counters(state, 2, 3)
            assert not state.read("state.watcher-cuda") and not (state.directory / "state.watcher-cuda").exists()
            container_id = podman.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
            checkpointed = podman.cli("container", "checkpoint", "--keep", name)
            shim_lines = [line[-300:] for line in checkpointed.stderr.splitlines() if "gpuckpt" in line or
                          "level=" in line][-8:]
            info = manifest(Path("/var/lib/containers/storage/overlay-containers") / container_id / "userdata" /
                            "checkpoint")
            results["late_driver"] = {"shim_lines": shim_lines, "cuda_processes": len(info["processes"]),
                                      "timings": info["timings"]}
            assert (state.directory / "state.watcher-cuda").exists(), "the watcher never began using CUDA"
            assert any("began holding the GPU driver" in line for line in shim_lines), \
                shim_lines
            assert len(info["processes"]) == 2, info["processes"]
            podman.cli("container", "restore", name)
            results["late_driver"]["after"] = assert_continues(state, before)
            log(f"late driver: taken again with {len(info['processes'])} CUDA processes; both go on")
    finally:
        podman.cli("rm", "-f", name, check=False)


def scenario_server_twice(results: dict) -> str | None:
    """The compiled inference server (torch.compile with CUDA graphs, inductor's compile workers beside it)
    checkpointed and restored twice by podman through gpuckpt-runtimed: after each restore it answers with
    the bytes it answered before. What each container process holds of the driver is logged before each
    checkpoint."""
    podman = harness.Podman()
    name = f"gpu-server-twice-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    site, eager, _ = cold_vs_restore.prepare_model()
    rounds: list[dict] = []
    results["server_twice"] = {"rounds": rounds}
    try:
        with harness.nftables_network_lock(), harness.resident_helper(harness.OUT / "runtimed.log"):
            podman.import_rootfs()
            podman.cli("run", "-d", "--name", name, *podman.RUN_FLAGS,
                       *cold_vs_restore.server_run_args(podman, "compiled", site, state.directory))
            reference = cold_vs_restore.ask(cold_vs_restore.container_pid(podman, name))
            cold_vs_restore.near_eager(reference, eager)
            for round_number in (1, 2):
                holders = harness.driver_holders(cold_vs_restore.container_pid(podman, name))
                checkpointed = podman.cli("container", "checkpoint", name, check=False)
                record = {"round": round_number, "holders": holders,
                          "checkpoint_stderr": checkpointed.stderr.strip().splitlines()[-6:]}
                rounds.append(record)
                if checkpointed.returncode != 0:
                    cold_vs_restore.keep_criu_logs(podman, name, harness.OUT)
                    raise AssertionError(f"checkpoint {round_number} failed: {record['checkpoint_stderr']}")
                restored = podman.cli("container", "restore", name)
                record["restore_stderr"] = restored.stderr.strip().splitlines()[-3:]
                cold_vs_restore.correct(cold_vs_restore.ask(cold_vs_restore.container_pid(podman, name), 90),
                                        reference, eager)
                log(f"server twice: round {round_number} answered as before")
    finally:
        podman.cli("rm", "-f", name, check=False)


@harness.nftables_network_lock()
def scenario_ddp_one_rank(results: dict) -> str | None:
    """DistributedDataParallel with NCCL on one GPU: the per-rank baseline for two."""
    bit_exact_training(
        results,
        "ddp_1",
        "train_ddp.py",
        {"WORLD": "1", **NCCL_KEEP, **NCCL_SAFE, "NCCL_NVLS_ENABLE": "0"},
        network=True,
    )


@harness.nftables_network_lock()
def scenario_ddp_two_ranks(results: dict) -> str | None:
    """DistributedDataParallel with NCCL, 2 ranks on 2 GPUs in one container, started with the settings
    the driver needs: checkpointed, killed, restored, and the weights equal an uninterrupted run's."""
    if gpu_count() < 2:
        return "this machine has one GPU"
    bit_exact_training(
        results,
        "ddp_2",
        "train_ddp.py",
        {"WORLD": "2", **NCCL_KEEP, **NCCL_SAFE, "NCCL_NVLS_ENABLE": "0"},
        gpu_minors=[0, 1],
        network=True,
    )


def gpu_memory_used_mib() -> int:
    return int(sh("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout.split()[0])


HOG = """
import sys, torch
gib = float(sys.argv[1])
block = torch.ones(int(gib * 2**30) // 4, device="cuda")
total = float(block.sum())
assert total == block.numel(), total
print(f"hog: {gib} GiB allocated and summed", flush=True)
"""


def scenario_suspend(results: dict) -> str | None:
    """A 16 GiB workload suspended: its GPU memory is freed, another process allocates and computes
    in it; resume is refused while that memory is taken (the workload stays suspended), then resumes
    and the workload verifies its device data. The same container's full checkpoint/restore for scale."""
    return suspend_and_full_checkpoint(results, "suspend")


def scenario_suspend_hugepages(results: dict) -> str | None:
    """The same with cuda.host_hugepages = "always" (suspend and resume take it too): each beside the full
    checkpoint and restore under the same setting, and the node's THP setting as it was after."""
    config = Path("/etc/gpuckpt/config.toml")
    plain = config.read_text()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    before = thp.read_text().strip()
    config.write_text(plain + '[cuda]\nhost_hugepages = "always"\n')
    try:
        suspend_and_full_checkpoint(results, "suspend_hugepages")
    finally:
        config.write_text(plain)
    results["suspend_hugepages"].update(thp_before=before, thp_after=thp.read_text().strip())
    assert thp.read_text().strip() == before, "the node's THP setting was not put back"
    return None


def suspend_and_full_checkpoint(results: dict, key: str) -> str | None:
    bundle = Bundle(key.replace("_", ""), COUNTER, {"GIB": "16"})
    images = Path(f"/dev/shm/gpuckpt-img-{key}")
    record: dict = {}
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3, timeout_s=300)
        used_before = gpu_memory_used_mib()
        started = time.monotonic()
        out = sh(CLI, "suspend", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT).stdout.strip()
        record["suspend_s"] = round(time.monotonic() - started, 3)
        used_suspended = gpu_memory_used_mib()
        status = sh(CLI, "status", "--json").stdout
        assert bundle.name in status
        total_mib = int(sh("nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits").stdout.split()[0])
        hog_gib = (total_mib - used_suspended) / 1024 - 4
        hog = subprocess.Popen([TORCH_PYTHON, "-c", HOG + "\nimport time; time.sleep(30)", str(hog_gib)],
                               stdout=subprocess.PIPE, text=True)
        assert "hog:" in hog.stdout.readline(), "the other job could not use the freed memory"
        refused = subprocess.run([CLI, "resume", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT],
                                 capture_output=True, text=True)
        assert refused.returncode != 0 and "stays suspended" in refused.stderr, refused.stderr
        assert bundle.name in sh(CLI, "status", "--json").stdout
        hog.kill()
        hog.wait()
        time.sleep(1)
        started = time.monotonic()
        sh(CLI, "resume", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT)
        record["resume_s"] = round(time.monotonic() - started, 3)
        assert_continues(bundle, before)
        record.update(
            gpu_used_mib_before=used_before,
            gpu_used_mib_suspended=used_suspended,
            other_job_gib=round(hog_gib, 1),
            refused_message=refused.stderr.strip()[-300:],
            suspend_output=out,
        )
        log(f"{key}: {record}")
        current = wait_counters(bundle, 1, 1)
        record["full_checkpoint_s"], _ = bundle.checkpoint(images)
        record["full_restore_s"] = bundle.restore(images)
        assert_continues(bundle, current)
        record["full_checkpoint_s"] = round(record["full_checkpoint_s"], 3)
        record["full_restore_s"] = round(record["full_restore_s"], 3)
        record["suspend_over_full_checkpoint"] = round(record["suspend_s"] / record["full_checkpoint_s"], 3)
        log(f"{key}: full checkpoint {record['full_checkpoint_s']} s, restore {record['full_restore_s']} s; suspend "
            f"over full checkpoint {record['suspend_over_full_checkpoint']}")
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)
    results[key] = record
    return None


def gpu_count() -> int:
    return len(sh("nvidia-smi", "-L").stdout.strip().splitlines())


def scenario_restore_on_other_gpu(results: dict) -> str | None:
    """Checkpointed on GPU 0, restored in a bundle that gives the container GPU 1: the shim remaps the UUID."""
    if gpu_count() < 2:
        return "this machine has one GPU"
    bundle = Bundle("remap", COUNTER, {"GIB": "2"}, gpu_minors=[0])
    images = Path("/dev/shm/gpuckpt-img-remap")
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3)
        bundle.checkpoint(images)
        spec = json.loads((bundle.dir / "config.json").read_text())
        spec["linux"]["devices"] = nvidia_devices([1])
        (bundle.dir / "config.json").write_text(json.dumps(spec, indent=1))
        try:
            restore_s = bundle.restore(images)
        except RuntimeError:
            bundle.destroy()
            results["remap_diagnosis"] = diagnose_remap()
            raise
        assert_continues(bundle, before)
        on_gpu1 = sh("nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader").stdout
        results["restore_on_other_gpu"] = {"restore_s": round(restore_s, 3), "compute_apps": on_gpu1.strip(),
                                           "log": bundle.last_messages.strip()[-500:]}
        log(f"restore on GPU 1: {restore_s:.2f} s; compute apps now: {on_gpu1.strip()}")
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)


def diagnose_remap() -> list[dict]:
    """By hand, after the shim's remapped restore failed: which device nodes and pairs let the driver
    restore a process checkpointed on GPU 0 into a container given GPU 1 (a failed restore leaves
    the process checkpointed, so each variant is tried on the same process)."""
    # gpuckpt is importable on the GPU machine only once harness.install() has filled SITE
    sys.path.insert(0, str(harness.SITE))
    from gpuckpt.cuda.devices import list_gpus
    from gpuckpt.cuda.driver import GpuPair, load_driver
    from gpuckpt.oci.spec import read_spec
    from gpuckpt.shim.devnodes import sync_nvidia_nodes

    tried: list[dict] = []
    bundle = Bundle("remapdiag", COUNTER, {"GIB": "2"}, gpu_minors=[0])
    images = Path("/dev/shm/gpuckpt-img-remapdiag")
    try:
        bundle.start()
        wait_counters(bundle, 1, 3)
        bundle.checkpoint(images)
        spec = json.loads((bundle.dir / "config.json").read_text())
        spec["linux"]["devices"] = nvidia_devices([1])
        (bundle.dir / "config.json").write_text(json.dumps(spec, indent=1))
        sh("runc", "--root", RUNTIME_ROOT, "restore", "-d", "--bundle", str(bundle.dir), "--image-path", str(images),
           bundle.name, stdin=subprocess.DEVNULL)
        init = int(json.loads(sh("runc", "--root", RUNTIME_ROOT, "state", bundle.name).stdout)["pid"])
        pids = [int(p) for p in sh("runc", "--root", RUNTIME_ROOT, "ps", "--format", "json", bundle.name).stdout
                .strip("[]\n").split(",") if p.strip()]
        uuids = [gpu.uuid for gpu in list_gpus()]
        driver = load_driver()
        driver.init()
        dev = lambda: sorted(os.listdir(f"/proc/{init}/root/dev"))  # noqa: E731
        one, swap = [GpuPair(uuids[0], uuids[1])], [GpuPair(uuids[0], uuids[1]), GpuPair(uuids[1], uuids[0])]
        for label, fix_nodes, pairs in (("old /dev, one pair", False, one), ("old /dev, permutation", False, swap),
                                        ("spec /dev, one pair", True, one), ("spec /dev, permutation", True, swap)):
            if fix_nodes:
                sync_nvidia_nodes(init, read_spec(str(bundle.dir)).linux.devices)
            entry = {"variant": label, "dev": dev(), "pids": pids}
            try:
                for pid in pids:
                    if driver.state(pid).name == "CHECKPOINTED":
                        driver.restore(pid, pairs)
                for pid in pids:
                    driver.unlock(pid)
                entry["result"] = "restored"
            except Exception as error:  # record every variant's answer
                entry["result"] = f"{type(error).__name__}: {error}"
            tried.append(entry)
            log(f"remap diagnosis: {entry}")
            if entry["result"] == "restored":
                break
    except Exception as error:
        tried.append({"error": f"{type(error).__name__}: {error}"[-1000:]})
    finally:
        bundle.destroy()
        shutil.rmtree(images, ignore_errors=True)
    return tried


def scenario_suspend_other_gpu(results: dict) -> str | None:
    """Suspended on GPU 0, resumed on GPU 1 (`gpuckpt resume --gpu UUID`): the same process goes on there
    with its device data intact. The container is given both GPUs, so it can reach the second."""
    if gpu_count() < 2:
        return "this machine has one GPU"
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in sh("nvidia-smi", "-L").stdout.strip().splitlines()]
    bundle = Bundle("suspend2", COUNTER, {"GIB": "16"}, gpu_minors=[0, 1])
    try:
        bundle.start()
        before = wait_counters(bundle, 1, 3, timeout_s=300)
        pid = int((bundle.dir / "pid").read_text())
        started = time.monotonic()
        sh(CLI, "suspend", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT)
        suspend_s = time.monotonic() - started
        started = time.monotonic()
        out = sh(
            CLI, "resume", bundle.name, "--engine", "runc", "--root", RUNTIME_ROOT, "--gpu", uuids[1]
        ).stdout.strip()
        resume_s = time.monotonic() - started
        after = assert_continues(bundle, before)
        apps = sh("nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader").stdout.strip()
        on = [line for line in apps.splitlines() if line.split(",")[1].strip() == uuids[1]]
        assert on and all(line.split(",")[1].strip() == uuids[1] for line in apps.splitlines()), apps
        results.setdefault("suspend_other_gpu", {}).update(
            suspend_s=round(suspend_s, 3), resume_on_gpu1_s=round(resume_s, 3), compute_apps_after=apps,
            container_init_pid=pid, before=before, after=after, resume_output=out)
        log(f"suspend on GPU 0 {suspend_s:.2f} s, resume on GPU 1 {resume_s:.2f} s; apps now {apps}")
    finally:
        bundle.destroy()


NCCL_SAFE = {"NCCL_P2P_DISABLE": "1", "NCCL_CUMEM_ENABLE": "0"}
# torch.distributed's TCPStore server runs on libuv, whose io_uring CRIU cannot dump (torch's
# libuv ignored UV_USE_IO_URING=0 on 2x H200); USE_LIBUV=0 takes TCPStore's plain backend.
NCCL_KEEP = {"NCCL_SOCKET_IFNAME": "lo", "USE_LIBUV": "0"} | {
    key: os.environ[key]
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
    if key in os.environ
}


def scenario_nccl(results: dict) -> str | None:
    """A live 2-rank NCCL job: refused without the safe settings (and keeps running); checkpointed,
    restored and still all-reducing correctly with them."""
    if gpu_count() < 2:
        return "this machine has one GPU"
    record: dict = {}
    unsafe = Bundle("nccl-unsafe", ["python3", "/work/nccl_job.py"], {"NCCL_NVLS_ENABLE": "0", **NCCL_KEEP},
                    gpu_minors=[0, 1], own_network=True)
    try:
        unsafe.start()
        before = wait_counters(unsafe, 2, 3, timeout_s=300)
        _, refused = unsafe.checkpoint(Path("/dev/shm/gpuckpt-img-nccl-unsafe"), check=False)
        assert refused.returncode != 0 and "NCCL_P2P_DISABLE=1" in refused.stderr, refused.stderr
        assert_continues(unsafe, before)
        record["refused_message"] = refused.stderr.strip()[-400:]
        log(f"nccl without safe settings: refused, job goes on: {refused.stderr.strip()[-200:]}")
    finally:
        unsafe.destroy()
    # The job's own network namespace holds its loopback TCP connections; there is no iptables
    # binary here, so CRIU (through runc's config file) locks it with libnftables.
    Path("/etc/criu").mkdir(exist_ok=True)
    Path("/etc/criu/runc.conf").write_text("network-lock nftables\n")
    safe = Bundle("nccl-safe", ["python3", "/work/nccl_job.py"], {"NCCL_NVLS_ENABLE": "0", **NCCL_KEEP, **NCCL_SAFE},
                  gpu_minors=[0, 1], own_network=True)
    images = Path("/dev/shm/gpuckpt-img-nccl")
    try:
        safe.start()
        before = wait_counters(safe, 2, 3, timeout_s=300)
        checkpoint_s, _ = safe.checkpoint(images, "--tcp-established")
        safe.renew_netns()
        restore_s = safe.restore(images, "--tcp-established")
        after = assert_continues(safe, before)
        record.update(checkpoint_s=round(checkpoint_s, 3), restore_s=round(restore_s, 3), after=after)
        log(f"nccl with safe settings: checkpoint {checkpoint_s:.2f} s, restore {restore_s:.2f} s, {before} -> {after}")
    finally:
        safe.destroy()
        shutil.rmtree(images, ignore_errors=True)
        Path("/etc/criu/runc.conf").unlink(missing_ok=True)
    results["nccl"] = record


@harness.nftables_network_lock()
def scenario_docker(results: dict) -> str | None:
    """`docker checkpoint create` and `docker start --checkpoint` on a CUDA container: containerd
    freezes the container before calling the runtime's checkpoint; the shim thaws it for the GPU
    steps. Also --leave-running. The workload verifies its device data and goes on."""
    docker = harness.Docker()
    driver = docker.start()
    name = f"gpu-docker-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    container_id = ""
    try:
        docker.import_rootfs()
        docker.run_gpu(name, COUNTER, {"GIB": "2", "STATE": "/state/state"}, state)
        container_id = docker.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
        before = wait_counters(state, 1, 3)
        started = time.monotonic()
        docker.cli("checkpoint", "create", name, "cp1")
        checkpoint_s = time.monotonic() - started
        status = docker.cli("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        assert status == "exited", status
        images = harness.Docker.DATA_ROOT / "containers" / container_id / "checkpoints" / "cp1"
        info = manifest(images)
        assert info["processes"] and info["gpu_handler"] == "gpuckpt", info
        started = time.monotonic()
        docker.cli("start", "--checkpoint", "cp1", name)
        restore_s = time.monotonic() - started
        after = assert_continues(state, before)
        # the shim's own share of those (docker packs the image into containerd's content store
        # and out again around it)
        restored_line = next((line for line in docker.runtime_log(container_id).splitlines()
                              if "restored" in line and "total_s" in line), "")
        started = time.monotonic()
        docker.cli("checkpoint", "create", "--leave-running", name, "cp2")
        live_s = time.monotonic() - started
        live = assert_continues(state, after)
        # containerd pauses every task it checkpoints; its bundle (and the runtime's log) outlives
        # only a --leave-running checkpoint
        runtime_log = docker.runtime_log(container_id)
        assert "frozen by the engine" in runtime_log, runtime_log[-2000:]
        downtime = manifest(images.parent / "cp2")["timings"]["downtime_s"]
        results["docker"] = {"storage_driver": driver, "checkpoint_s": round(checkpoint_s, 3),
                             "restore_s": round(restore_s, 3), "leave_running_checkpoint_s": round(live_s, 3),
                             "leave_running_downtime_s": round(downtime, 3), "before": before, "after": after,
                             "after_leave_running": live, "manifest_timings": info["timings"],
                             "shim_restore_phases": restored_line}
        log(f"docker: checkpoint {checkpoint_s:.2f} s (frozen by containerd, thawed for the GPU steps), "
            f"start --checkpoint {restore_s:.2f} s, {before} -> {after}; --leave-running downtime {downtime:.2f} s -> "
            f"{live}; "
            f"the shim's checkpoint phases {info['timings']}; its restore: {restored_line}")
    except Exception:
        if container_id:
            docker.keep_logs(container_id)
            results["docker_runtime_log"] = docker.runtime_log(container_id)[-12000:]
        raise
    finally:
        docker.cli("rm", "-f", name, check=False)
        docker.stop()


@harness.nftables_network_lock()
def scenario_podman_archive(results: dict) -> str | None:
    """A CUDA container moved as an archive: `gpuckpt export` (podman checkpoint through the shim,
    streamed through zstd), the container removed, `gpuckpt import` (pages staged, claimed by the
    shim's restore). The GPU manifest travels inside the archive and the restore uses it."""
    podman = harness.Podman()
    name = f"gpu-podman-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    archive = Path("/var/tmp") / f"{name}.tar.zst"
    try:
        podman.import_rootfs()
        podman.run_gpu(name, COUNTER, {"GIB": "2", "STATE": "/state/state"}, state)
        before = wait_counters(state, 1, 3)
        started = time.monotonic()
        exported = sh(CLI, "export", name, "-o", str(archive), env=podman.env)
        export_s = time.monotonic() - started
        inside = json.loads(sh(CLI, "inspect", "--json", str(archive), env=podman.env).stdout)
        assert inside["manifest"]["processes"] and inside["manifest"]["gpu_handler"] == "gpuckpt", inside
        podman.cli("rm", "-f", name)
        started = time.monotonic()
        # --trust-config: the container binds host directories (the userland), which an
        # archive from elsewhere may not ask for unless the operator says so
        imported = sh(CLI, "import", "--trust-config", str(archive), env=podman.env)
        import_s = time.monotonic() - started
        after = assert_continues(state, before)
        results["podman_archive"] = {
            "export_s": round(export_s, 3), "import_s": round(import_s, 3), "archive_bytes": archive.stat().st_size,
            "cuda_processes": len(inside["manifest"]["processes"]), "before": before, "after": after,
            "export_output": exported.stdout.strip()[-300:], "import_output": imported.stdout.strip()[-300:]}
        log(f"podman archive: export {export_s:.2f} s, import {import_s:.2f} s, "
            f"{archive.stat().st_size / 2**30:.2f} GiB, {before} -> {after}; {imported.stdout.strip()[-200:]}")
    finally:
        podman.cli("rm", "-f", name, check=False)
        archive.unlink(missing_ok=True)


def scenario_resident(results: dict) -> str | None:
    """A CUDA container checkpointed and restored by podman through gpuckpt-runtimed, the resident helper: the
    worker, forked from a process that loaded the verbs before any CUDA call, locks and checkpoints the
    device state of a process the caller's delegate dumps, and restores it; the counter goes on. The same
    container's verbs worked in the shim's own process (helper stopped) are timed beside them."""
    podman = harness.Podman()
    name = f"gpu-resident-{os.getpid()}"
    helper_log = harness.OUT / "runtimed.log"
    rounds: list[dict] = []
    try:
        with harness.nftables_network_lock():  # podman gives even --network none a netns; no iptables here
            _resident_rounds(podman, name, helper_log, rounds)
    finally:
        podman.cli("rm", "-f", name, check=False)
    results["resident"] = {"rounds": rounds, "helper_journal": helper_log.read_text().splitlines()[-12:]}


def _resident_rounds(podman: harness.Podman, name: str, helper_log: Path, rounds: list[dict]) -> None:
    podman.import_rootfs()
    state = gpu_container(podman, name, {"GIB": "2"})
    container_id = podman.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
    for way in ("resident", "in-process", "resident", "in-process"):
        with harness.resident_helper(helper_log) if way == "resident" else contextlib.nullcontext():
            before = wait_counters(state, 1, 3)
            started = time.monotonic()
            podman.cli("container", "checkpoint", name)
            checkpointed = time.monotonic()
            podman.cli("container", "restore", name)
            restored = time.monotonic()
            after = assert_continues(state, before)
            rounds.append({"way": way, "checkpoint_s": round(checkpointed - started, 3),
                           "restore_s": round(restored - checkpointed, 3), "before": before, "after": after})
            log(f"resident: {way} checkpoint {checkpointed - started:.2f} s, restore {restored - checkpointed:.2f} s")
    journal_lines = helper_log.read_text().splitlines()
    worked = [line for line in journal_lines if container_id in line]
    assert sum(f"checkpoint {container_id}" in line and "exit 0" in line for line in worked) == 2, journal_lines
    assert sum(f"restore {container_id}" in line and "exit 0" in line for line in worked) == 2, journal_lines


def inventory_record(container_id: str) -> dict | None:
    path = Path("/run/gpuckpt/containers") / f"{container_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def gpuckpt_python(code: str) -> object:
    """What `code` prints as JSON, run by the interpreter gpuckpt was installed for (its wheels on SITE)."""
    return json.loads(sh(TORCH_PYTHON, "-c", code, env=dict(os.environ, PYTHONPATH=str(harness.SITE))).stdout)


def recorded_gpu_container(engine: harness.Engine, name: str,
                           nvml: dict[int, str]) -> tuple[str, dict, harness.StateDir]:
    """Run the counter on GPU 0 through `engine`; its id, the record the hook wrote (checked
    against the engine's name and NVML's UUID of GPU 0) and its state directory."""
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    engine.import_rootfs()
    engine.run_gpu(name, COUNTER, {"GIB": "1", "STATE": "/state/state"}, state)
    container_id = engine.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
    record = inventory_record(container_id)
    assert record and record["engine"] == type(engine).__name__.lower(), record
    assert [(gpu["minor"], gpu["uuid"]) for gpu in record["gpus"]] == [(0, nvml[0])], (record, nvml)
    return container_id, record, state


def nvml_uuids() -> dict[int, str]:
    code = ("import json; from gpuckpt.cuda.devices import list_gpus; "
            "print(json.dumps({gpu.minor: gpu.uuid for gpu in list_gpus()}))")
    return {int(minor): uuid for minor, uuid in gpuckpt_python(code).items()}


def install_hooks_d() -> None:
    """gpuckpt-hook's hooks.d files, as `gpuckpt install --engine podman` writes them."""
    hooks_dir = Path("/etc/containers/oci/hooks.d")
    hooks_dir.mkdir(parents=True, exist_ok=True)
    files = gpuckpt_python(f"import json; from gpuckpt.node.hooks_d import hooks_d_files; "
                           f"print(json.dumps(hooks_d_files({harness.HOOK!r})))")
    for file_name, text in files.items():
        (hooks_dir / file_name).write_text(text)


class Gpuckptd:
    """The node service as a process (no systemd here), its log in WORK."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.log = env, harness.WORK / "gpuckptd.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        earlier = self.log.stat().st_size if self.log.exists() else 0
        self.process = subprocess.Popen([harness.GPUCKPTD], env=self.env, stderr=open(self.log, "ab"))
        deadline = time.monotonic() + 600  # a restore at start comes before READY
        while "ready on" not in self.log.read_bytes()[earlier:].decode(errors="replace"):
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()[-2000:]
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=600)


def gpu_container(podman: harness.Podman, name: str, env: dict[str, str], *annotations: str) -> harness.StateDir:
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    flags = [arg for annotation in ("io.gpuckpt.inventory=true", *annotations) for arg in ("--annotation", annotation)]
    podman.cli("run", "-d", "--name", name, *podman.RUN_FLAGS, *flags,
               *harness.gpu_run_args(COUNTER, {"STATE": "/state/state", **env}, state.directory, podman.IMAGE))
    return state


@harness.nftables_network_lock()
def scenario_service_podman(results: dict) -> str | None:
    """gpuckptd on the GPU: an idle container (io.gpuckpt.idle-suspend-after=1) suspended by policy,
    its GPU memory freed, resumed with its data intact; then two GPU containers drained through
    podman, the service restarted, both restored at its start and going on from their state."""
    install_hooks_d()
    podman = harness.Podman()
    config = Path("/etc/gpuckpt/config.toml")
    config.write_text(config.read_text() + '[service]\narchive_dir = "/var/tmp/gpuckpt-drain"\n'
                      "drain_on_stop = false\nidle_min_minutes = 0.05\n")
    service = Gpuckptd(podman.env)
    names = [f"gpu-svc-{os.getpid()}-{which}" for which in ("idle", "a", "b")]
    found: dict = {}
    # a warm machine keeps an earlier run's containers, drain and log: none of it may count here
    earlier = podman.cli("ps", "-a", "--format", "{{.Names}}").stdout.split()
    podman.cli("rm", "-f", "-t", "0", *[name for name in earlier if name.startswith("gpu-svc-")], check=False)
    shutil.rmtree("/var/tmp/gpuckpt-drain", ignore_errors=True)
    service.log.unlink(missing_ok=True)
    try:
        podman.import_rootfs()
        service.start()
        idle = gpu_container(podman, names[0], {"GIB": "4", "IDLE": "1"}, "io.gpuckpt.idle-suspend-after=1")
        before_idle = wait_counters(idle, 1, 3)
        used_before = gpu_memory_used_mib()
        deadline = time.monotonic() + 180
        while "idle reclaim: suspended" not in service.log.read_text():
            assert time.monotonic() < deadline, service.log.read_text()[-3000:]
            time.sleep(2)
        suspended_after_s = round(180 - (deadline - time.monotonic()), 1)
        used_suspended = gpu_memory_used_mib()
        assert used_suspended < used_before - 3000, (used_before, used_suspended)
        mid = assert_continues(idle, before_idle)  # its CPU side goes on while suspended
        sh(CLI, "resume", "--engine", "podman", names[0], env=podman.env)
        (idle.directory / "state.check").touch()
        time.sleep(1)
        resumed = assert_continues(idle, mid)
        assert all(status == "ok" for _, _, status in resumed), resumed
        found["idle"] = {"suspended_after_s": suspended_after_s, "gpu_mib_before": used_before,
                         "gpu_mib_suspended": used_suspended, "after_resume": resumed}
        podman.cli("rm", "-f", "-t", "0", names[0])
        states = [gpu_container(podman, name, {"GIB": "2"}) for name in names[1:]]
        befores = [wait_counters(state, 1, 3) for state in states]
        started = time.monotonic()
        drained = sh(CLI, "drain", "--json", env=podman.env)
        drain_s = time.monotonic() - started
        events = [json.loads(line) for line in drained.stdout.splitlines()]
        assert events[-1]["event"] == "result" and events[-1]["ok"] and len(events[-1]["done"]) == 2, events
        # where each stopped: a restored container must go on from here, not merely past `befores`
        stopped_at = [harness.counter_states(state, 1) for state in states]
        assert [[token for token, _, _ in at] for at in stopped_at] == [[token for token, _, _ in b] for b in befores]
        service.stop()
        started = time.monotonic()
        service.start()
        restore_s = time.monotonic() - started
        afters = [assert_continues(state, at) for state, at in zip(states, stopped_at)]
        found["drain"] = {"drain_s": round(drain_s, 2), "restart_and_restore_s": round(restore_s, 2),
                          "events": events, "before": befores, "stopped_at": stopped_at, "after": afters}
        log(f"service: idle container suspended after {suspended_after_s} s ({used_before} -> {used_suspended} MiB), "
            f"resumed intact; drain of 2 GPU containers {drain_s:.1f} s, restart with restore {restore_s:.1f} s, "
            f"{befores} -> {afters}")
    finally:
        found["log"] = service.log.read_text()[-6000:] if service.log.exists() else ""
        results["service_podman"] = found
        service.stop()
        podman.cli("rm", "-f", "-t", "0", *names, check=False)
    return None


def scenario_service_docker(results: dict) -> str | None:
    """gpuckptd draining a docker GPU container (checkpoint create, in docker's own store; its record
    in the archive directory) and restoring it at its next start (docker start --checkpoint)."""
    docker = harness.Docker()
    docker.start()
    config = Path("/etc/gpuckpt/config.toml")
    saved = config.read_text()
    config.write_text(saved + '[hook]\nadd_to_spec = true\n[criu]\nnetwork_lock = "nftables"\n'
                      '[service]\narchive_dir = "/var/tmp/gpuckpt-drain-docker"\ndrain_on_stop = false\n')
    shutil.rmtree("/var/tmp/gpuckpt-drain-docker", ignore_errors=True)
    service = Gpuckptd(dict(docker.env, DOCKER_HOST=f"unix://{docker.SOCKET}"))
    service.log.unlink(missing_ok=True)
    name = f"gpu-svc-docker-{os.getpid()}"
    found: dict = {}
    try:
        service.start()
        docker.import_rootfs()
        state = harness.StateDir(name, harness.WORK / f"{name}-state")
        docker.run_gpu(name, COUNTER, {"GIB": "2", "STATE": "/state/state"}, state)
        before = wait_counters(state, 1, 3)
        started = time.monotonic()
        drained = sh(CLI, "drain", "--json", env=service.env)
        drain_s = time.monotonic() - started
        events = [json.loads(line) for line in drained.stdout.splitlines()]
        assert events[-1]["event"] == "result" and events[-1]["ok"] and len(events[-1]["done"]) == 1, events
        assert docker.cli("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "false"
        stopped_at = harness.counter_states(state, 1)
        assert [token for token, _, _ in stopped_at] == [token for token, _, _ in before]
        service.stop()
        started = time.monotonic()
        service.start()
        restore_s = time.monotonic() - started
        after = assert_continues(state, stopped_at)
        found = {"drain_s": round(drain_s, 2), "restart_and_restore_s": round(restore_s, 2), "events": events,
                 "before": before, "stopped_at": stopped_at, "after": after}
        log(f"service under docker: drain {drain_s:.1f} s, restart with restore {restore_s:.1f} s, "
            f"{stopped_at} -> {after}")
    finally:
        found["log"] = service.log.read_text()[-4000:] if service.log.exists() else ""
        results["service_docker"] = found
        service.stop()
        config.write_text(saved)
        docker.cli("rm", "-f", name, check=False)
        docker.stop()
    return None


@harness.nftables_network_lock()
def scenario_hook_podman(results: dict) -> str | None:
    """gpuckpt-hook on a real driver under podman (hooks.d): a GPU container recorded with the UUID
    NVML gives its /dev/nvidiaN, kept across a checkpoint and restore (runc runs createRuntime in
    CRIU's setup-namespaces), dropped when the container goes; a container asking for a GPU the
    node lacks refused with the hook's line."""
    nvml = nvml_uuids()
    information = {path.parent.name: path.read_text()
                   for path in Path("/proc/driver/nvidia/gpus").glob("*/information")}
    install_hooks_d()
    found: dict = {"nvml_uuid_by_minor": nvml, "proc_information": information}
    podman = harness.Podman()
    name = f"gpu-hook-{os.getpid()}"
    try:
        container_id, record, state = recorded_gpu_container(podman, name, nvml)
        before = wait_counters(state, 1, 3)
        podman.cli("container", "checkpoint", name)
        podman.cli("container", "restore", name)
        after = assert_continues(state, before)
        restored = inventory_record(container_id)
        assert restored and restored["pid"] != record["pid"] and restored["gpus"] == record["gpus"], restored
        podman.cli("rm", "-f", "-t", "0", name)
        assert inventory_record(container_id) is None
        found["podman"] = {"record": record, "after_restore": restored, "before": before, "after": after}
        missing = max(nvml) + 1
        (harness.WORK / f"nvidia{missing}").unlink(missing_ok=True)
        os.mknod(harness.WORK / f"nvidia{missing}", 0o600 | 0o020000, os.makedev(195, missing))
        refused = podman.cli("run", "-d", "--name", f"{name}-x", "--network", "none", "--device",
                             f"{harness.WORK / f'nvidia{missing}'}:/dev/nvidia{missing}", podman.IMAGE, "true",
                             check=False)
        assert refused.returncode != 0 and f"is given /dev/nvidia{missing} but this node has no such GPU" in \
            refused.stderr, refused.stderr
        found["refused"] = refused.stderr.strip()[-400:]
    finally:
        podman.cli("rm", "-f", "-t", "0", name, f"{name}-x", check=False)
    results["hook_podman"] = found
    log(f"hook under podman: record {found['podman']['record']['gpus']}; refused: {found['refused'][-160:]}")
    return None


def scenario_hook_docker(results: dict) -> str | None:
    """gpuckpt-hook under docker, added to the spec by the runtime's create (hook.add_to_spec)."""
    nvml = nvml_uuids()
    found: dict = {}
    name = f"gpu-hook-{os.getpid()}"
    docker = harness.Docker()
    docker.start()
    config = Path("/etc/gpuckpt/config.toml")
    saved = config.read_text()
    config.write_text(saved + "[hook]\nadd_to_spec = true\n")
    try:
        container_id, record, _ = recorded_gpu_container(docker, name, nvml)
        docker.cli("rm", "-f", name)
        assert inventory_record(container_id) is None
        found["docker"] = {"record": record}
    finally:
        config.write_text(saved)
        docker.cli("rm", "-f", name, check=False)
        docker.stop()
    results["hook_docker"] = found
    log(f"hook under docker: record {found['docker']['record']}")
    return None


SCENARIOS = {name.removeprefix("scenario_"): fn for name, fn in globals().items() if name.startswith("scenario_")}


def multigpu_summary(results: dict) -> dict:
    """The training-job figures side by side: bit-exactness per shape, one rank against two."""
    ran = {key: results[key] for key in ("dataloader_fork", "dataloader_spawn", "ddp_1", "ddp_2") if key in results}
    if not ran:
        return {}
    summary: dict = {"machine": results["machine"], "passed": results["passed"], "failed": results["failed"],
                     "dataloader_bit_exact": ran.get("dataloader_fork", {}).get("bit_exact"),
                     "dataloader_spawn_bit_exact": ran.get("dataloader_spawn", {}).get("bit_exact"),
                     "nccl_bit_exact": ran.get("ddp_2", {}).get("bit_exact"),
                     "restore_on_other_gpu_ok": "restore_on_other_gpu" in results["passed"]}
    one, two = ran.get("ddp_1", {}).get("manifest_timings"), ran.get("ddp_2", {}).get("manifest_timings")
    if one and two:
        for phase in ("device_checkpoint_s", "dump_s", "total_s"):
            summary[f"one_rank_{phase}"], summary[f"two_ranks_{phase}"] = one[phase], two[phase]
        summary["two_over_one_device_checkpoint"] = round(two["device_checkpoint_s"] / one["device_checkpoint_s"], 3)
        summary["one_rank_restore_s"], summary["two_ranks_restore_s"] = (
            ran["ddp_1"]["restore_s"],
            ran["ddp_2"]["restore_s"],
        )
    summary["runs"] = ran
    return summary


def main() -> int:
    out = Path(sys.argv[1])
    harness.OUT = out
    chosen = sys.argv[2:] or list(SCENARIOS)
    results: dict = {"machine": "", "facts": install(), "passed": [], "failed": {}, "not_run": {}}
    results["machine"] = results["facts"]["nvidia_smi"]
    for name in chosen:
        log(f"--- {name}")
        try:
            not_run = SCENARIOS[name](results)
            if not_run:
                results["not_run"][name] = not_run
            else:
                results["passed"].append(name)
        except Exception as error:  # record and go on: one call must bring back every result
            traceback.print_exc()
            results["failed"][name] = f"{type(error).__name__}: {error}"[-2000:]
        (out / "gpu_tests.json").write_text(json.dumps(results, indent=2))
    if summary := multigpu_summary(results):
        (out / "multigpu.json").write_text(json.dumps(summary, indent=2))
    log(f"passed {len(results['passed'])}, failed {len(results['failed'])}: {list(results['failed'])}, "
        f"not run: {results['not_run']}")
    print(f"{len(results['passed'])} passed, {len(results['failed'])} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
