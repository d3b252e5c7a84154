"""docker (dockerd + containerd) with gpuckpt-runtime registered in daemon.json."""

from __future__ import annotations

import itertools
import json
import os

import pytest
from bed import COUNTER_SOURCE, DOCKER, DOCKER_IMAGE, assert_continues, sh, wait_counter

_names = itertools.count()


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
    info = json.loads(sh(DOCKER, "info", "--format", "{{json .Runtimes}}").stdout)
    assert "gpuckpt-runtime" in info


def test_checkpoint_create_and_start_from_it(container) -> None:
    read_state = state_reader(container)
    runtime = sh(DOCKER, "inspect", "--format", "{{.HostConfig.Runtime}}", container).stdout.strip()
    assert runtime == "gpuckpt-runtime"
    before = wait_counter(read_state, minimum=3)
    sh(DOCKER, "checkpoint", "create", container, "cp1")
    status = sh(DOCKER, "inspect", "--format", "{{.State.Status}}", container).stdout.strip()
    assert status == "exited"
    sh(DOCKER, "start", "--checkpoint", "cp1", container)
    assert_continues(before, read_state)


def test_checkpoint_leave_running(container) -> None:
    read_state = state_reader(container)
    before = wait_counter(read_state, minimum=3)
    sh(DOCKER, "checkpoint", "create", "--leave-running", container, "cp-live")
    assert_continues(before, read_state)
    sh(DOCKER, "stop", "-t", "1", container)
    sh(DOCKER, "start", "--checkpoint", "cp-live", container)
    after = assert_continues(before, read_state)
    assert after.token == before.token
