"""A job that spans podman containers, checkpointed and restored as one (`gpuckpt checkpoint --group`,
`gpuckpt restore --group`) with real podman, runc and CRIU, no GPU: two ranks in one pod passing a counter over
the pod's loopback go on from their state on the same connection; a member whose checkpoint podman refuses
leaves every member running as before, the one line naming it.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from bed import COUNTER_SOURCE, PODMAN_IMAGE, assert_continues, read_state, sh, wait_counter

PINGPONG_SOURCE = (Path(__file__).parent / "workloads" / "pingpong.py").read_text()
_groups = itertools.count()


def gpuckpt(*argv: str) -> subprocess.CompletedProcess:
    """The CLI of the gpuckpt under test (the one this interpreter imports), as users run it."""
    return sh(sys.executable, "-m", "gpuckpt.cli.main", *argv, check=False, timeout=300)


def status(name: str) -> str:
    return sh("podman", "inspect", "--format", "{{.State.Status}} {{.State.Checkpointed}}", name).stdout.strip()


class Job:
    """Containers labelled io.gpuckpt.group=LABEL, named h35g-PID-N-ROLE; removed by name after."""

    def __init__(self) -> None:
        self.label = f"h35g-{os.getpid()}-{next(_groups)}"
        self.names: list[str] = []
        self.pod = ""

    def run(self, role: str, *argv: str, pod: bool = False, extra: tuple[str, ...] = ()) -> str:
        name = f"{self.label}-{role}"
        where = ["--pod", self.pod] if pod else ["--network", "none"]
        sh("podman", "run", "-d", "--name", name, "--label", f"io.gpuckpt.group={self.label}", *where, *extra,
           PODMAN_IMAGE, *argv)
        self.names.append(name)
        return name

    def make_pod(self) -> None:
        self.pod = f"{self.label}-pod"
        sh("podman", "pod", "create", "--name", self.pod, "--network", "none")

    def remove(self) -> None:
        for name in self.names:
            sh("podman", "rm", "-f", "-t", "0", name, check=False)
        if self.pod:
            sh("podman", "pod", "rm", "-f", self.pod, check=False)


@pytest.fixture
def job() -> Iterator[Job]:
    made = Job()
    yield made
    made.remove()


def test_two_ranks_over_a_pods_loopback_go_on_from_their_state(job: Job) -> None:
    job.make_pod()
    ranks = [job.run(role, "python3", "-c", PINGPONG_SOURCE, role, pod=True) for role in ("server", "client")]
    before = [wait_counter(read_state(name), minimum=5) for name in ranks]

    done = gpuckpt("checkpoint", "--group", job.label, "--tcp-established", "--leave-running")
    assert done.returncode == 0, done.stderr
    assert [status(name) for name in ranks] == ["running false"] * 2
    before = [assert_continues(state, read_state(name)) for state, name in zip(before, ranks, strict=True)]

    done = gpuckpt("checkpoint", "--group", job.label, "--tcp-established")
    assert done.returncode == 0, done.stderr
    assert [status(name) for name in ranks] == ["exited true"] * 2  # podman's view: checkpointed
    done = gpuckpt("restore", "--group", job.label, "--tcp-established")
    assert done.returncode == 0, done.stderr
    assert [status(name).split()[0] for name in ranks] == ["running"] * 2
    for name in ranks:  # podman's checkpoint of each, kept while the group could still fail, gone once it did not
        static_dir = sh("podman", "inspect", "--format", "{{.StaticDir}}", name).stdout.strip()
        assert not Path(static_dir, "checkpoint").exists()
    # the same processes on the same connection: the counts go on from where they were, past them
    after = [assert_continues(state, read_state(name)) for state, name in zip(before, ranks, strict=True)]
    assert all(after_state.count > state.count for after_state, state in zip(after, before, strict=True))


def test_a_member_podman_refuses_leaves_every_member_running_as_before(job: Job) -> None:
    first = job.run("a", "python3", "-c", COUNTER_SOURCE)
    refused = job.run("b", "python3", "-c", COUNTER_SOURCE, extra=("--rm",))  # podman: no checkpoint of --rm
    before = [wait_counter(read_state(name), minimum=3) for name in (first, refused)]

    done = gpuckpt("checkpoint", "--group", job.label)
    assert done.returncode == 1
    line = done.stderr.strip()
    assert "\n" not in line and f"member {refused}" in line and "--rm" in line, line
    assert "every member runs as before" in line, line
    # a was dumped before b was refused: restored, it goes on from its state; b never stopped
    assert [status(name).split()[0] for name in (first, refused)] == ["running"] * 2
    for state, name in zip(before, (first, refused), strict=True):
        assert_continues(state, read_state(name))


def test_a_restore_of_members_not_checkpointed_is_refused_naming_them(job: Job) -> None:
    name = job.run("a", "python3", "-c", COUNTER_SOURCE)
    before = wait_counter(read_state(name))
    done = gpuckpt("restore", "--group", job.label)
    assert done.returncode != 0 and f"running: {name}" in done.stderr
    assert_continues(before, read_state(name))
