"""shim/delegate.py's DelegateRun ends what the delegate started: runc dies of SIGTERM and leaves its criu, and a
dump whose peer never comes is ended at its deadline. Real processes: a shell script stands in for runc, and its
background `sleep` for the criu it started."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from gpuckpt.host.procfs import live_start_time, start_time
from gpuckpt.shim.delegate import DelegateRun


@pytest.fixture
def delegate(tmp_path: Path) -> tuple[Path, Path]:
    """A delegate that starts a long child (its pid written to a file) and waits on it."""
    pid_file = tmp_path / "criu.pid"
    script = tmp_path / "runc"
    script.write_text(f"#!/bin/sh\nsleep 1000 &\necho $! > {pid_file}.tmp\nmv {pid_file}.tmp {pid_file}\nwait\n")
    script.chmod(0o755)
    return script, pid_file


def _started_child(pid_file: Path) -> tuple[int, int]:
    deadline = time.monotonic() + 10
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the delegate never started its child"
        time.sleep(0.01)
    pid = int(pid_file.read_text())
    started = start_time(pid)
    assert started is not None
    return pid, started


def test_past_its_deadline_the_delegate_and_what_it_started_are_killed(delegate: tuple[Path, Path]) -> None:
    script, pid_file = delegate
    run = DelegateRun(str(script), [])
    run.start()
    child = _started_child(pid_file)
    began = time.monotonic()
    status = run.finish(timeout_s=0.5)
    assert run.timed_out and status == 128 + signal.SIGKILL
    assert time.monotonic() - began < 5
    assert live_start_time(child[0]) != child[1], "the delegate's child outlived it"


def test_a_terminating_signal_reaches_the_delegate_and_its_children_are_reaped(delegate: tuple[Path, Path]) -> None:
    script, pid_file = delegate
    run = DelegateRun(str(script), [], reap=True)
    run.start()
    child = _started_child(pid_file)
    os.kill(os.getpid(), signal.SIGTERM)  # as the engine would: our handler passes it on to the delegate
    status = run.finish()
    assert run.interrupted_by == signal.SIGTERM and not run.timed_out
    assert status == 128 + signal.SIGTERM  # sh dies of it; its background sleep would not
    assert live_start_time(child[0]) != child[1], "the delegate's child outlived it"


def test_without_reap_nothing_but_the_delegate_is_signalled(delegate: tuple[Path, Path]) -> None:
    script, pid_file = delegate
    run = DelegateRun(str(script), [])
    run.start()
    pid, started = _started_child(pid_file)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        run.finish()
        assert start_time(pid) == started  # a restore's delegate leaves the container it restored: not ours to kill
    finally:
        os.kill(pid, signal.SIGKILL)
