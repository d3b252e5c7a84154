"""Training jobs checkpointed mid-run, killed by the dump, restored and run to the end: the final weights equal an
uninterrupted run's bit for bit (plain loop, DataLoader workers forked and spawned, torch.compile, DDP over NCCL)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import harness
import pytest
from harness import NCCL_KEEP, NCCL_SAFE, TORCH_PYTHON, Bundle, log, manifest, sh

pytestmark = pytest.mark.gpu


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


def test_training_bit_exact(results: dict) -> None:
    """A plain training loop (data made on the GPU)."""
    bit_exact_training(results, "training", "train.py", {})


def test_dataloader_fork(results: dict) -> None:
    """The common loop: DataLoader(num_workers=2, pin_memory=True), workers forked after CUDA init
    (they hold the driver's descriptors and mappings, the driver does not know them)."""
    bit_exact_training(results, "dataloader_fork", "train_loader.py", {"WORKERS": "2", "PIN_MEMORY": "1"})


def test_dataloader_spawn(results: dict) -> None:
    """The same loop with spawned workers: multiprocessing's named semaphores need CRIU's link-remap."""
    bit_exact_training(results, "dataloader_spawn", "train_loader.py",
                       {"WORKERS": "2", "PIN_MEMORY": "1", "START_METHOD": "spawn"})


@pytest.mark.torch_compile  # CDI mode's image holds Triton and gcc only when one is selected
def test_compiled(results: dict) -> None:
    """The DataLoader loop with torch.compile: inductor's compile workers beside the forked data workers."""
    bit_exact_training(results, "compiled", "train_loader.py", {"WORKERS": "2", "PIN_MEMORY": "1", "COMPILE": "1"})


@harness.nftables_network_lock()
def test_ddp_one_rank(results: dict) -> None:
    """DistributedDataParallel with NCCL on one GPU: the per-rank baseline for two."""
    bit_exact_training(
        results,
        "ddp_1",
        "train_ddp.py",
        {"WORLD": "1", **NCCL_KEEP, **NCCL_SAFE, "NCCL_NVLS_ENABLE": "0"},
        network=True,
    )


@harness.nftables_network_lock()
def test_ddp_two_ranks(results: dict, two_gpus: None) -> None:
    """DistributedDataParallel with NCCL, 2 ranks on 2 GPUs in one container, started with the settings
    the driver needs: checkpointed, killed, restored, and the weights equal an uninterrupted run's."""
    bit_exact_training(
        results,
        "ddp_2",
        "train_ddp.py",
        {"WORLD": "2", **NCCL_KEEP, **NCCL_SAFE, "NCCL_NVLS_ENABLE": "0"},
        gpu_minors=[0, 1],
        network=True,
    )
