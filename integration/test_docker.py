"""docker (dockerd + containerd) with gpuckpt-runtime registered in daemon.json."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
from bed import (
    COUNTER_SOURCE,
    DOCKER,
    DOCKER_IMAGE,
    HERE,
    RUNTIME,
    assert_continues,
    configured_delegate,
    sh,
    start_from_checkpoint,
    wait_counter,
)

_names = itertools.count()
RESTART_DOCKERD = HERE / "testbed" / "restart-dockerd.sh"
DOCKER_DAEMON_JSON = Path("/etc/docker/daemon.json")  # where setup.sh's `gpuckpt install --engine docker` writes


@pytest.fixture
def container(docker_delegate):
    name = f"gpuckpt-it-{os.getpid()}-{next(_names)}"
    sh(DOCKER, "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
       DOCKER_IMAGE, "python3", "-c", COUNTER_SOURCE)
    yield name
    sh(DOCKER, "rm", "-f", name, check=False)


def state_reader(name: str):
    return lambda: sh(DOCKER, "exec", name, "cat", "/tmp/state").stdout


def test_runtime_is_registered() -> None:
    """dockerd runs the installed gpuckpt-runtime as `gpuckpt install --engine docker` registered it (setup.sh):
    its path in daemon.json and in dockerd's loaded runtimes, experimental on for `docker checkpoint`; and a
    container run with it goes through the shim: a config the shim refuses fails the run with the shim's line."""
    written = json.loads(DOCKER_DAEMON_JSON.read_text())["runtimes"]["gpuckpt-runtime"]
    assert written["path"] == RUNTIME, written  # the runtime on PATH, as install found it
    loaded = json.loads(sh(DOCKER, "info", "--format", "{{json .Runtimes}}").stdout)
    assert loaded.get("gpuckpt-runtime", {}).get("path") == RUNTIME, loaded
    assert sh(DOCKER, "version", "--format", "{{.Server.Experimental}}").stdout.strip() == "true"
    refused_name = f"gpuckpt-it-{os.getpid()}-{next(_names)}"
    ran_name = f"gpuckpt-it-{os.getpid()}-{next(_names)}"
    try:
        with configured_delegate("bin/runc"):  # a delegate the shim's config refuses on every call
            refused = sh(DOCKER, "run", "--runtime", "gpuckpt-runtime", "--name", refused_name, "--network", "none",
                         DOCKER_IMAGE, "true", check=False)
        assert refused.returncode != 0
        assert "must be a program name looked up on PATH" in refused.stderr, refused.stderr
        with configured_delegate("runc"):  # the same run, the config fixed: the shim passes it to runc
            ran = sh(DOCKER, "run", "--runtime", "gpuckpt-runtime", "--name", ran_name, "--network", "none",
                     DOCKER_IMAGE, "echo", "through gpuckpt-runtime")
        assert ran.stdout == "through gpuckpt-runtime\n"
    finally:
        for name in (refused_name, ran_name):
            sh(DOCKER, "rm", "-f", name, check=False)


def test_checkpoint_create_and_start_from_it(container) -> None:
    read_state = state_reader(container)
    runtime = sh(DOCKER, "inspect", "--format", "{{.HostConfig.Runtime}}", container).stdout.strip()
    assert runtime == "gpuckpt-runtime"
    before = wait_counter(read_state, minimum=3)
    sh(DOCKER, "checkpoint", "create", container, "cp1")
    status = sh(DOCKER, "inspect", "--format", "{{.State.Status}}", container).stdout.strip()
    assert status == "exited"
    started = start_from_checkpoint(container, "cp1")
    assert started.returncode == 0, started.stderr
    assert_continues(before, read_state)


def test_checkpoint_leave_running(container) -> None:
    read_state = state_reader(container)
    before = wait_counter(read_state, minimum=3)
    sh(DOCKER, "checkpoint", "create", "--leave-running", container, "cp-live")
    assert_continues(before, read_state)
    sh(DOCKER, "stop", "-t", "1", container)
    started = start_from_checkpoint(container, "cp-live")
    assert started.returncode == 0, started.stderr
    after = assert_continues(before, read_state)
    assert after.token == before.token


def test_the_shims_error_reaches_the_docker_user_on_a_node_not_in_utc() -> None:
    """containerd reads the runtime's last JSON log line with its `time` as RFC 3339; an offset without
    its colon (+0530) lost every message the shim gave docker users on nodes outside UTC (#19)."""
    name = f"gpuckpt-it-tz-{os.getpid()}"
    sh("env", "TZ=Asia/Kolkata", "bash", str(RESTART_DOCKERD))  # dockerd, its containerd and their shims at +05:30
    try:
        with configured_delegate("bin/runc"):  # a config every shim call refuses, with one line
            refused = sh(DOCKER, "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
                         DOCKER_IMAGE, "true", check=False)
        assert refused.returncode != 0
        assert "must be a program name looked up on PATH" in refused.stderr, refused.stderr
    finally:
        sh(DOCKER, "rm", "-f", name, check=False)
        sh("bash", str(RESTART_DOCKERD))
