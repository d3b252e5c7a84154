"""Multi-GPU containers as users start them: podman with one CDI device per GPU (`--device nvidia.com/gpu=N`)
from the self-contained image. A 2-rank DDP training job with DataLoader workers (bit exact against an
uninterrupted run of the same image) and a 2-rank tensor-parallel server (NCCL all-reduce in every layer; the same
answers), each checkpointed and restored, exported with --leave-running and imported; and the device phases of
1, 2 and 4 GPUs side by side, the same device memory per GPU. Run with `--inject cdi`."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import harness
import pytest
from harness import CLI, COUNTER, NCCL_KEEP, NCCL_SAFE, assert_continues, log, manifest, sh, timed, wait_counters

pytestmark = pytest.mark.gpu

# NCCL between the ranks of one container over the loopback only (P2P and shared memory off): the driver
# checkpoints neither peer mappings nor another process's memory, and podman's /dev/shm is a mount CRIU does not
# dump; the TCP connections on the loopback go with --tcp-established.
NCCL = {"NCCL_NVLS_ENABLE": "0", **NCCL_KEEP, **NCCL_SAFE, "NCCL_SHM_DISABLE": "1"}
SHM = ("--shm-size", "1g")  # DataLoader workers hand batches over /dev/shm
CONTAINERS = Path("/var/lib/containers/storage/overlay-containers")
ASK = ("import sys, urllib.request; print(urllib.request.urlopen("
       "f'http://127.0.0.1:8000/?seed={sys.argv[1]}', timeout=120).read().decode())")


def need_cdi() -> None:
    if harness.INJECT != "cdi":
        pytest.skip("the podman multi-GPU scenarios run with --inject cdi (or GPUCKPT_GPU_INJECT=cdi)")


def run(podman: harness.Podman, name: str, args: list[str], env: dict[str, str], state: harness.StateDir,
        gpus: list[int], *flags: str, detach: bool = True) -> None:
    # as `gpuckpt install --engine podman` leaves a node: gpuckpt-hook in hooks.d (at a restore it sets `lo` up
    # in the namespace runc makes, before CRIU reconnects the ranks' loopback connections)
    harness.install_hooks_d()
    podman.cli("run", *(["-d"] if detach else ["--rm"]), "--name", name, *podman.RUN_FLAGS, *SHM, *flags,
               *harness.gpu_run_args(args, env, state.directory, podman.IMAGE, gpu_minors=gpus), timeout=900)


def wait_for(what: str, ready, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout_s} s"
        time.sleep(0.1)


def checkpoint_manifest(podman: harness.Podman, name: str) -> dict:
    """The GPU manifest of a container podman checkpointed with --keep (read before its restore)."""
    container_id = podman.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
    return manifest(CONTAINERS / container_id / "userdata" / "checkpoint")


def keep_logs(podman: harness.Podman, name: str) -> None:
    """The container's CRIU and runtime logs (podman's userdata) beside the results, before it is removed."""
    inspected = podman.cli("inspect", "--format", "{{.Id}}", name, check=False)
    if inspected.returncode == 0:
        userdata = CONTAINERS / inspected.stdout.strip() / "userdata"
        for path in [*userdata.glob("*.log"), *userdata.glob("checkpoint/*.log"), *userdata.glob("*.json")]:
            shutil.copy(path, harness.result_path(f"{name}-{path.parent.name}-{path.stem}", path.suffix))


def removed(podman: harness.Podman, name: str, archive: Path) -> None:
    """The container gone (its logs kept first) and its archive with it."""
    keep_logs(podman, name)
    podman.cli("rm", "-f", name, check=False)
    archive.unlink(missing_ok=True)
    Path(f"{archive}.sig").unlink(missing_ok=True)


@harness.nftables_network_lock()  # podman gives even --network none a netns; no iptables there
def test_podman_ddp_two_gpus(results: dict, podman: harness.Podman, two_gpus: None) -> None:
    """DDP, 2 ranks on 2 CDI GPUs, 2 DataLoader workers per rank: checkpointed mid-run (the dump ends it),
    restored, run to the end; again exported with --leave-running (the original runs to the end), removed and
    imported (the import runs to the end): each end's weights equal an uninterrupted run's, bit for bit."""
    need_cdi()
    name = f"gpu-ddp2-{os.getpid()}"
    env = {"WORLD": "2", "STEPS": "300", "WORKERS": "2", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", **NCCL,
           "STATE": "/state/train_state", "RESULT": "/state/train_result"}
    reference_state = harness.StateDir(f"{name}-ref", harness.WORK / f"{name}-ref")
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    archive = Path("/var/tmp") / f"{name}.tar.zst"
    found: dict = {"env": env}
    results["podman_ddp_2"] = found
    step = lambda: int(state.read("train_state").strip() or -1)  # noqa: E731
    done = lambda: state.read("train_result").strip()  # noqa: E731
    try:
        found.update(podman.import_rootfs())
        found["reference_s"] = timed(lambda: run(podman, f"{name}-ref", ["python3", "/work/train_ddp.py"], env,
                                                 reference_state, [0, 1], detach=False))
        reference = reference_state.read("train_result").strip()
        assert reference, "the uninterrupted run wrote no result"
        paused = {**env, "PAUSE_AT": "60"}

        run(podman, name, ["python3", "/work/train_ddp.py"], paused, state, [0, 1])
        wait_for("step 80", lambda: step() >= 80)
        found["checkpoint_s"] = timed(lambda: podman.cli("container", "checkpoint", "--keep", "--tcp-established",
                                                         name))
        found["checkpointed_at_step"] = step()
        info = checkpoint_manifest(podman, name)
        found["cuda_processes"], found["manifest_timings"] = len(info["processes"]), info["timings"]
        found["restore_s"] = timed(lambda: podman.cli("container", "restore", "--keep", "--tcp-established", name))
        wait_for("the restored run's end", done)
        found["restored_sha256"] = done()
        found["bit_exact_restore"] = done() == reference

        podman.cli("rm", "-f", name)
        for leftover in ("train_state", "train_result"):
            (state.directory / leftover).unlink(missing_ok=True)
        run(podman, name, ["python3", "/work/train_ddp.py"], paused, state, [0, 1])
        wait_for("step 80", lambda: step() >= 80)
        found["export_leave_running_s"] = timed(lambda: sh(CLI, "export", "--leave-running", "--tcp-established",
                                                           name, "-o", str(archive), env=podman.env))
        found["exported_at_step"] = step()
        wait_for("the original run's end", done)
        found["bit_exact_left_running"] = done() == reference
        podman.cli("rm", "-f", name)
        (state.directory / "train_result").unlink()
        # --trust-config: the CDI spec's per-file driver mounts are host paths, which an import refuses unless told
        found["import_s"] = timed(lambda: sh(CLI, "import", "--trust-config", "--tcp-established", str(archive),
                                             env=podman.env))
        wait_for("the imported run's end", done)
        found["bit_exact_import"] = done() == reference
        found["reference_sha256"] = reference
        log(f"podman ddp 2 GPUs: {found['cuda_processes']} CUDA processes, checkpoint at step "
            f"{found['checkpointed_at_step']} {found['checkpoint_s']} s, restore {found['restore_s']} s, export "
            f"--leave-running {found['export_leave_running_s']} s, import {found['import_s']} s; bit exact: "
            f"{found['bit_exact_restore']}, {found['bit_exact_left_running']}, {found['bit_exact_import']}")
        assert found["bit_exact_restore"] and found["bit_exact_left_running"] and found["bit_exact_import"], found
    finally:
        removed(podman, name, archive)


@harness.nftables_network_lock()
def test_podman_tp_server_two_gpus(results: dict, podman: harness.Podman, two_gpus: None) -> None:
    """A 2-rank tensor-parallel server on 2 CDI GPUs answers three requests; after a checkpoint and restore, after
    an export with --leave-running (the original) and after the import: the same three answers."""
    need_cdi()
    name = f"gpu-tp2-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    archive = Path("/var/tmp") / f"{name}.tar.zst"
    env = {"WORLD": "2", "BALLAST_GIB": "2", **NCCL, "STATE": "/state/tp_state"}
    found: dict = {"env": env}
    results["podman_tp_2"] = found
    seeds = (1, 2, 3)

    def ask() -> list[str]:
        return [podman.cli("exec", name, "python3", "-c", ASK, str(seed), timeout=300).stdout.strip()
                for seed in seeds]

    try:
        found.update(podman.import_rootfs())
        run(podman, name, ["python3", "/work/tp_server.py"], env, state, [0, 1])
        wait_for("the server's start", lambda: state.read("tp_state").strip() == "ready")
        answers = ask()
        assert len(set(answers)) == len(seeds) and all(len(answer) == 64 for answer in answers), answers
        found["answers"] = answers
        found["checkpoint_s"] = timed(lambda: podman.cli("container", "checkpoint", "--keep", "--tcp-established",
                                                         name))
        info = checkpoint_manifest(podman, name)
        found["cuda_processes"], found["manifest_timings"] = len(info["processes"]), info["timings"]
        found["restore_s"] = timed(lambda: podman.cli("container", "restore", "--keep", "--tcp-established", name))
        found["same_after_restore"] = ask() == answers
        found["export_leave_running_s"] = timed(lambda: sh(CLI, "export", "--leave-running", "--tcp-established",
                                                           name, "-o", str(archive), env=podman.env))
        found["same_left_running"] = ask() == answers
        podman.cli("rm", "-f", name)
        found["import_s"] = timed(lambda: sh(CLI, "import", "--trust-config", "--tcp-established", str(archive),
                                             env=podman.env))
        found["same_after_import"] = ask() == answers
        log(f"podman tp server 2 GPUs: checkpoint {found['checkpoint_s']} s, restore {found['restore_s']} s, export "
            f"--leave-running {found['export_leave_running_s']} s, import {found['import_s']} s; same answers: "
            f"{found['same_after_restore']}, {found['same_left_running']}, {found['same_after_import']}")
        assert found["same_after_restore"] and found["same_left_running"] and found["same_after_import"], found
    finally:
        removed(podman, name, archive)


@harness.nftables_network_lock()
def test_podman_device_phases_by_gpu_count(results: dict, podman: harness.Podman, two_gpus: None) -> None:
    """One container with 1, 2 and (where the machine has them) 4 CDI GPUs, one process per GPU holding the same
    device memory each: checkpointed and restored through podman, each process's data intact; the manifest's
    device phase and the whole checkpoint side by side."""
    need_cdi()
    per_gpu_gib = 4
    counts = [count for count in (1, 2, 4) if count <= harness.gpu_count()]
    found: dict = {"per_gpu_gib": per_gpu_gib}
    results["podman_gpu_scaling"] = found
    podman.import_rootfs()
    for count in counts:
        name = f"gpu-scale{count}-{os.getpid()}"
        state = harness.StateDir(name, harness.WORK / f"{name}-state")
        try:
            run(podman, name, COUNTER, {"GIB": str(per_gpu_gib), "PROCS": str(count), "SPREAD": "1", **NCCL_SAFE,
                                        "STATE": "/state/state"}, state, list(range(count)))
            before = wait_counters(state, count, 3, timeout_s=300)
            checkpoint_s = timed(lambda: podman.cli("container", "checkpoint", "--keep", name))  # noqa: B023
            info = checkpoint_manifest(podman, name)
            restore_s = timed(lambda: podman.cli("container", "restore", name))  # noqa: B023
            after = assert_continues(state, before)
            found[f"{count}_gpus"] = {"checkpoint_s": checkpoint_s, "restore_s": restore_s,
                                      "cuda_processes": len(info["processes"]), "timings": info["timings"],
                                      "after": after}
            log(f"podman {count} GPU(s) x {per_gpu_gib} GiB: checkpoint {checkpoint_s} s (device "
                f"{info['timings']['device_checkpoint_s']:.2f} s, dump {info['timings']['dump_s']:.2f} s), "
                f"restore {restore_s} s")
        finally:
            podman.cli("rm", "-f", name, check=False)
            shutil.rmtree(state.directory, ignore_errors=True)
    one = found["1_gpus"]["timings"]["device_checkpoint_s"]
    for count in counts[1:]:
        found[f"{count}_over_1_device_checkpoint"] = round(
            found[f"{count}_gpus"]["timings"]["device_checkpoint_s"] / one, 3)
        found[f"{count}_over_1_restore"] = round(found[f"{count}_gpus"]["restore_s"] / found["1_gpus"]["restore_s"], 3)
