"""gpuckptd on the GPU: an idle container suspended by policy and resumed; GPU containers drained and restored
at the service's next start, under podman and under docker."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import harness
import pytest
from harness import (
    CLI,
    COUNTER,
    Gpuckptd,
    assert_continues,
    gpu_container,
    gpu_memory_used_mib,
    install_hooks_d,
    log,
    sh,
    wait_counters,
)

pytestmark = pytest.mark.gpu


@harness.nftables_network_lock()
def test_service_podman(results: dict, podman: harness.Podman) -> None:
    """gpuckptd on the GPU: an idle container (io.gpuckpt.idle-suspend-after=1) suspended by policy,
    its GPU memory freed, resumed with its data intact; then two GPU containers drained through
    podman, the service restarted, both restored at its start and going on from their state."""
    install_hooks_d()
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


def test_service_docker(results: dict, docker: harness.Docker) -> None:
    """gpuckptd draining a docker GPU container (checkpoint create, in docker's own store; its record
    in the archive directory) and restoring it at its next start (docker start --checkpoint)."""
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
