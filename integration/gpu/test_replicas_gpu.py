"""One checkpoint, other GPUs and more than one container, through podman with CDI (issues 34 and 35):
- a container moved onto another GPU (`gpuckpt import --gpu nvidia.com/gpu=1`) and back (`store restore --gpu`),
  the same process going on there with its device data intact, the driver showing it on the new GPU;
- K replicas of one stored checkpoint restored at once, each onto its own GPU (bench/scale_out.py, K = 1 the
  baseline of the same run), each answering only once it has gone on from the checkpoint with its data intact;
- gpuckptd's warm pool: a standby of an archive held with no GPU memory, handed out by `gpuckpt pool take`,
  going on from the archive's state; the next standby restored behind it.
Run with `--inject cdi`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import harness
import pytest
from harness import CLI, COUNTER, Gpuckptd, assert_continues, gpu_memory_used_mib, log, sh, timed, wait_counters

pytestmark = pytest.mark.gpu

KIND = "nvidia.com/gpu"


def need_cdi() -> None:
    if harness.INJECT != "cdi":
        pytest.skip("the CDI scenarios run with --inject cdi (or GPUCKPT_GPU_INJECT=cdi)")


def on_gpus(podman: harness.Podman, name: str) -> list[str]:
    """The UUIDs of the GPUs the driver shows the container's CUDA process (its init, the counter) on."""
    pid = podman.cli("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
    apps = sh("nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader").stdout
    return sorted({uuid.strip() for app_pid, uuid in (line.split(",") for line in apps.strip().splitlines())
                   if app_pid.strip() == pid})


@harness.nftables_network_lock()  # podman gives even --network none a netns; no iptables there
def test_podman_gpu_move(results: dict, podman: harness.Podman, two_gpus: None) -> None:
    """Started on GPU 0, exported, imported onto GPU 1, then stored and restored back onto GPU 0: the same
    process each time (its token), counting on with its data intact, on the GPU it was sent to."""
    need_cdi()
    name = f"gpu-move-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    archive = Path("/var/tmp") / f"{name}.tar.zst"
    store = harness.WORK / f"{name}-store"
    uuids = [gpu["uuid"] for gpu in harness.gpus()]
    found: dict = {}
    results["gpu_move"] = found
    try:
        found.update(podman.import_rootfs())
        podman.cli("run", "-d", "--name", name, *podman.RUN_FLAGS,
                   *harness.gpu_run_args(COUNTER, {"GIB": "2", "STATE": "/state/state"}, state.directory,
                                         podman.IMAGE, gpu_minors=[0]))
        before = wait_counters(state, 1, 3, timeout_s=180)
        assert on_gpus(podman, name) == [uuids[0]]

        found["export_s"] = timed(lambda: sh(CLI, "export", name, "-o", str(archive), env=podman.env))
        stopped_at = harness.counter_states(state, 1)
        assert [token for token, _, _ in stopped_at] == [token for token, _, _ in before]
        podman.cli("rm", "-f", name)
        found["import_onto_1_s"] = timed(lambda: sh(CLI, "import", "--trust-config", "--gpu", f"{KIND}=1",
                                                    str(archive), env=podman.env))
        found["after_import"] = assert_continues(state, stopped_at)
        found["on_after_import"] = on_gpus(podman, name)
        assert found["on_after_import"] == [uuids[1]], (found["on_after_import"], uuids)

        found["store_checkpoint_s"] = timed(lambda: sh(CLI, "store", "checkpoint", "--store", str(store), "--name",
                                                       name, name, env=podman.env))
        stopped_at = harness.counter_states(state, 1)
        podman.cli("rm", "-f", name)
        found["store_restore_onto_0_s"] = timed(lambda: sh(CLI, "store", "restore", "--store", str(store),
                                                           "--trust-config", "--gpu", f"{KIND}=0", name,
                                                           env=podman.env))
        found["after_store_restore"] = assert_continues(state, stopped_at)
        found["on_after_store_restore"] = on_gpus(podman, name)
        assert found["on_after_store_restore"] == [uuids[0]], (found["on_after_store_restore"], uuids)
        log(f"gpu move: export {found['export_s']} s, import onto GPU 1 {found['import_onto_1_s']} s, store "
            f"restore onto GPU 0 {found['store_restore_onto_0_s']} s; {found['after_store_restore']}")
    finally:
        podman.cli("rm", "-f", name, check=False)
        archive.unlink(missing_ok=True)
        Path(f"{archive}.sig").unlink(missing_ok=True)
        sh("rm", "-rf", str(store), check=False)


# A replica answers once its counter (in its own /tmp, not a shared bind) has gone past where the source stood
# after the checkpoint, with the same process's token and its device data intact: python3, the image has no grep.
PROBE = ("python3 -c \"import sys; t, c, v = open('/tmp/state.0').read().split(); "
         "sys.exit(not (t == '{token}' and int(c) > {counter} and v == 'ok'))\"")


@harness.nftables_network_lock()
def test_podman_scale_out(results: dict, podman: harness.Podman) -> None:
    """bench/scale_out.py on the GPUs: one stored checkpoint of a GPU container (--leave-running), K replicas of
    it restored at once, the i-th onto GPU i, for K = 1 (the baseline) and K = every GPU, alternating; on a
    machine of one GPU, K = 2 both onto it (the store's and podman's part side by side, no GPU of its own each)."""
    need_cdi()
    name = f"gpu-scale-{os.getpid()}"
    store = harness.WORK / f"{name}-store"
    count = harness.gpu_count()
    devices = [str(i) for i in range(count)] if count > 1 else ["0", "0"]
    found: dict = {"devices": devices}
    results["scale_out"] = found
    try:
        found.update(podman.import_rootfs())
        podman.cli("run", "-d", "--name", name, *podman.RUN_FLAGS,
                   *harness.gpu_run_args(COUNTER, {"GIB": "2", "STATE": "/tmp/state"}, harness.WORK, podman.IMAGE,
                                         gpu_minors=[0]))
        def read() -> list[str]:  # the image has python but no cat
            return podman.cli("exec", name, "python3", "-c", "print(open('/tmp/state.0').read())",
                              check=False).stdout.split()

        deadline = time.monotonic() + 180
        while len(read()) < 3 or int(read()[1]) < 3:
            assert time.monotonic() < deadline, read()
            time.sleep(0.2)
        found["store_checkpoint_s"] = timed(lambda: sh(CLI, "store", "checkpoint", "--store", str(store), "--name",
                                                       name, "--leave-running", name, env=podman.env))
        token, counter, verdict = read()
        assert verdict == "ok"
        out = harness.result_path("scale_out")
        bench = sh(sys.executable, str(harness.REPO / "bench" / "scale_out.py"), "--store", str(store),
                   "--checkpoint", name, "--kind", KIND, "--devices", ",".join(devices),
                   "--counts", f"1,{len(devices)}", "--rounds", "2", "--trust-config", "--timeout-s", "300",
                   "--probe", PROBE.format(token=token, counter=counter), "--out", str(out),
                   env=podman.env, timeout=1200)
        log(bench.stdout)
        found["bench"] = json.loads(out.read_text())
        found["checkpointed_token"], found["source_counter_after_checkpoint"] = token, int(counter)
    finally:
        podman.cli("rm", "-f", "-t", "0", name, check=False)
        sh("rm", "-rf", str(store), check=False)


def pool_state(env: dict[str, str]) -> dict:
    events = [json.loads(line) for line in sh(CLI, "pool", "status", "--json", env=env).stdout.splitlines()]
    return next(event for event in events if event.get("event") == "pool")


def wait_ready(env: dict[str, str], service: Gpuckptd, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while not (state := pool_state(env))["standbys"]:
        assert time.monotonic() < deadline, service.log.read_text()[-3000:]
        time.sleep(1)
    return state


@harness.nftables_network_lock()
def test_podman_pool(results: dict, podman: harness.Podman) -> None:
    """gpuckptd keeps one standby of a GPU container's archive: no GPU memory held; `gpuckpt pool take` hands it
    out resumed, going on from the archive's state, data intact; the pool restores the next one behind it."""
    need_cdi()
    name = f"gpu-pool-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    archive = Path("/var/tmp") / f"{name}.tar.zst"
    config = Path("/etc/gpuckpt/config.toml")
    original = config.read_text()
    service = Gpuckptd(podman.env, "gpuckptd-pool.log")
    service.log.unlink(missing_ok=True)
    found: dict = {}
    results["pool"] = found
    taken: list[str] = []
    try:
        harness.install_hooks_d()
        found.update(podman.import_rootfs())
        podman.cli("run", "-d", "--name", name, *podman.RUN_FLAGS,
                   *harness.gpu_run_args(COUNTER, {"GIB": "2", "STATE": "/state/state"}, state.directory,
                                         podman.IMAGE))
        wait_counters(state, 1, 3, timeout_s=180)
        sh(CLI, "export", name, "-o", str(archive), env=podman.env)
        at_export = harness.counter_states(state, 1)
        podman.cli("rm", "-f", name)
        idle_mib = gpu_memory_used_mib()
        config.write_text(original + f'[pool]\nstandbys = {{ "{archive}" = 1 }}\nhost_budget_bytes = {64 << 30}\n')
        started = time.monotonic()
        service.start()
        ready = wait_ready(podman.env, service)
        found["first_standby_ready_s"] = round(time.monotonic() - started, 2)
        found["standby_host_bytes"] = ready["held_bytes"]
        found["gpu_mib_idle"], found["gpu_mib_with_standby"] = idle_mib, gpu_memory_used_mib()
        assert found["gpu_mib_with_standby"] < idle_mib + 500, found  # a standby holds no device memory
        for turn in range(2):
            started = time.monotonic()
            took = sh(CLI, "pool", "take", str(archive), env=podman.env).stdout.strip()
            found[f"take_{turn}_s"] = round(time.monotonic() - started, 2)
            taken.append(took)
            found[f"after_take_{turn}"] = assert_continues(state, at_export)
            podman.cli("rm", "-f", "-t", "0", took)  # the next one writes the same state file
            (state.directory / "state.0").unlink(missing_ok=True)
            started = time.monotonic()
            wait_ready(podman.env, service)
            found[f"next_standby_ready_{turn}_s"] = round(time.monotonic() - started, 2)
        log(f"pool: first standby ready {found['first_standby_ready_s']} s ({ready['held_bytes'] / 2**30:.2f} GiB "
            f"host, GPU {found['gpu_mib_with_standby']} MiB vs {idle_mib} idle), take {found['take_0_s']} s / "
            f"{found['take_1_s']} s, next standby {found['next_standby_ready_0_s']} s")
    finally:
        found["log"] = service.log.read_text()[-4000:] if service.log.exists() else ""
        config.write_text(original)
        service.stop()
        leftovers = podman.cli("ps", "-a", "--format", "{{.Names}}").stdout.split()
        podman.cli("rm", "-f", "-t", "0", name, *taken, *[n for n in leftovers if n.startswith("gpuckpt-pool-")],
                   check=False)
        archive.unlink(missing_ok=True)
        Path(f"{archive}.sig").unlink(missing_ok=True)
