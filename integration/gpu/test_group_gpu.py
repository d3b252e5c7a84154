"""A job that spans containers: rank 0 and rank 1 of a 2-rank DDP job (train_ddp.py with RANK), each in its own
podman container with one CDI GPU, in one pod, NCCL between them over the pod's loopback. `gpuckpt checkpoint
--group` locks both ranks' CUDA processes before either is dumped (locked one after the other, the second rank's
lock waits for ever on a collective the first can no longer join); `gpuckpt restore --group` brings both back onto
their GPUs only once both are restored. First with --leave-running (the job goes on), then stopped and restored:
the final weights equal an uninterrupted run's of the same two containers, bit for bit. Run with `--inject cdi`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import harness
import pytest
from harness import CLI, NCCL_KEEP, NCCL_SAFE, log, sh

pytestmark = pytest.mark.gpu

# As for one container with two GPUs (test_multi_gpu_podman.py): P2P and shared memory off, the ranks over the
# loopback, which the pod's containers share; their TCP connections go with --tcp-established.
NCCL = {"NCCL_NVLS_ENABLE": "0", **NCCL_KEEP, **NCCL_SAFE, "NCCL_SHM_DISABLE": "1"}
GROUP_LABEL = "io.gpuckpt.group"


def need_cdi() -> None:
    if harness.INJECT != "cdi":
        pytest.skip("the podman multi-GPU scenarios run with --inject cdi (or GPUCKPT_GPU_INJECT=cdi)")


class Job:
    """Two ranks in the pod NAME-pod, labelled io.gpuckpt.group=NAME, rank r on GPU r; rank 0 writes the state."""

    def __init__(self, podman: harness.Podman, name: str, env: dict[str, str]) -> None:
        self.podman, self.name, self.env = podman, name, env
        self.pod = f"{name}-pod"
        self.state = harness.StateDir(name, harness.WORK / f"{name}-state")
        self.ranks = [f"{name}-rank{rank}" for rank in (0, 1)]

    def start(self) -> None:
        for leftover in ("train_state", "train_result"):
            (self.state.directory / leftover).unlink(missing_ok=True)
        harness.install_hooks_d()
        self.podman.cli("pod", "create", "--name", self.pod, "--network", "none")
        for rank, name in enumerate(self.ranks):
            args = harness.gpu_run_args(["python3", "/work/train_ddp.py"], {**self.env, "RANK": str(rank)},
                                        self.state.directory, self.podman.IMAGE, gpu_minors=[rank])
            network = args.index("--network")
            del args[network:network + 2]  # the pod's namespace: the ranks share its loopback
            self.podman.cli("run", "-d", "--name", name, "--pod", self.pod, "--label", f"{GROUP_LABEL}={self.name}",
                            *self.podman.RUN_FLAGS, "--shm-size", "1g", *args, timeout=900)

    def step(self) -> int:
        return int(self.state.read("train_state").strip() or -1)

    def result(self) -> str:
        return self.state.read("train_result").strip()

    def status(self) -> list[str]:
        return [self.podman.cli("inspect", "--format", "{{.State.Status}} {{.State.Checkpointed}}",
                                name).stdout.strip() for name in self.ranks]

    def gpuckpt(self, *argv: str) -> float:
        started = time.monotonic()
        sh(CLI, *argv, env=self.podman.env, timeout=1800)
        return round(time.monotonic() - started, 2)

    def remove(self) -> None:
        for name in self.ranks:
            self.podman.cli("rm", "-f", name, check=False)
        self.podman.cli("pod", "rm", "-f", self.pod, check=False)


def wait_for(what: str, ready, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout_s} s"
        time.sleep(0.1)


@harness.nftables_network_lock()  # the pod's namespace: no iptables on these machines
def test_podman_group_ddp_two_containers(results: dict, podman: harness.Podman, two_gpus: None) -> None:
    need_cdi()
    name = f"gpu-group-{os.getpid()}"
    env = {"WORLD": "2", "STEPS": "300", "WORKERS": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", **NCCL,
           "STATE": "/state/train_state", "RESULT": "/state/train_result"}
    found: dict = {"env": env}
    results["podman_group_ddp_2"] = found
    reference, job = Job(podman, f"{name}-ref", env), Job(podman, name, {**env, "PAUSE_AT": "60"})
    try:
        found.update(podman.import_rootfs())
        reference.start()
        wait_for("the uninterrupted run's end", reference.result, timeout_s=1800)
        found["reference_sha256"] = reference.result()

        job.start()
        wait_for("step 70", lambda: job.step() >= 70)
        found["leave_running_s"] = job.gpuckpt("checkpoint", "--group", name, "--tcp-established", "--leave-running")
        found["left_running_at_step"] = job.step()
        assert job.status() == ["running false"] * 2
        wait_for("a step after the left-running checkpoint", lambda: job.step() > found["left_running_at_step"])

        found["checkpoint_s"] = job.gpuckpt("checkpoint", "--group", name, "--tcp-established")
        found["checkpointed_at_step"] = job.step()
        assert job.status() == ["exited true"] * 2, job.status()  # podman's view: both checkpointed
        found["restore_s"] = job.gpuckpt("restore", "--group", name, "--tcp-established")
        wait_for("the restored run's end", job.result)
        found["restored_sha256"] = job.result()
        found["bit_exact"] = job.result() == found["reference_sha256"]
        log(f"podman group of 2 containers (DDP, one rank each): --leave-running {found['leave_running_s']} s at "
            f"step {found['left_running_at_step']}, checkpoint {found['checkpoint_s']} s at step "
            f"{found['checkpointed_at_step']}, restore {found['restore_s']} s; bit exact: {found['bit_exact']}")
        assert found["bit_exact"], found
    finally:
        for each in (reference, job):
            each.remove()
        for each in (reference, job):
            for leftover in Path(each.state.directory).glob("train_*"):
                leftover.unlink(missing_ok=True)
