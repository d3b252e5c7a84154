"""CUDA containers under podman through gpuckpt-runtime: archives (gpuckpt export/import), --leave-running
export beside podman's own, the resident helper, a process that begins using CUDA mid-checkpoint, the compiled
inference server checkpointed twice."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

import cold_vs_restore
import harness
import pytest
from harness import CLI, COUNTER, assert_continues, gpu_container, log, machine_floors, manifest, sh, wait_counters

pytestmark = pytest.mark.gpu


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
def test_podman_leave_running_export(results: dict, podman: harness.Podman) -> None:
    """The GPU downtime of `gpuckpt export --leave-running` beside podman's own `container checkpoint
    --leave-running --export` (through the shim, uncompressed) of the same container, in turns: as the
    workload saw it (its counter standing still) and as the shim timed it (lock to unlock)."""
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
    harness.result_path("leave_running_export").write_text(
        json.dumps(results["podman_leave_running_export"], indent=2))


def test_late_driver(results: dict, podman: harness.Podman) -> None:
    """A process that begins using CUDA while its container is being checkpointed (late_cuda.py's watcher, as a
    compile pool waking up): the first dump fails on it, the checkpoint is rolled back and taken again with it as
    a CUDA process, and after the restore both processes go on with their device data intact."""
    name = f"gpu-late-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    try:
        with harness.nftables_network_lock(), harness.resident_helper(harness.result_path("runtimed", ".log")):
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


@pytest.mark.torch_compile  # CDI mode's image holds Triton and gcc only when one is selected
def test_server_twice(results: dict, podman: harness.Podman) -> None:
    """The compiled inference server (torch.compile with CUDA graphs, inductor's compile workers beside it)
    checkpointed and restored twice by podman through gpuckpt-runtimed: after each restore it answers with
    the bytes it answered before. What each container process holds of the driver is logged before each
    checkpoint."""
    name = f"gpu-server-twice-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    site, eager, _ = cold_vs_restore.prepare_model()
    rounds: list[dict] = []
    results["server_twice"] = {"rounds": rounds}
    try:
        with harness.nftables_network_lock(), harness.resident_helper(harness.result_path("runtimed", ".log")):
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
def test_podman_archive(results: dict, podman: harness.Podman) -> None:
    """A CUDA container moved as an archive: `gpuckpt export` (podman checkpoint through the shim,
    streamed through zstd), the container removed, `gpuckpt import` (pages staged, claimed by the
    shim's restore). The GPU manifest travels inside the archive and the restore uses it."""
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


def test_resident(results: dict, podman: harness.Podman) -> None:
    """A CUDA container checkpointed and restored by podman through gpuckpt-runtimed, the resident helper: the
    worker, forked from a process that loaded the verbs before any CUDA call, locks and checkpoints the
    device state of a process the caller's delegate dumps, and restores it; the counter goes on. The same
    container's verbs worked in the shim's own process (helper stopped) are timed beside them."""
    name = f"gpu-resident-{os.getpid()}"
    helper_log = harness.result_path("runtimed", ".log")
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
