"""The storage roots podman gave the conmon that started the runtime (host/conmon.py), read from a real process tree:
a parent named conmon whose command line is podman's, and its child standing in for the runtime."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpuckpt.host.conmon import StorageRoots, conmon_storage_roots

EXIT = "--exit-command-arg"


@contextmanager
def runtime_under(parent_name: str, args: list[str], tmp_path: Path) -> Iterator[int]:
    """The pid of a child of a process whose executable is named `parent_name` and whose arguments are `args`."""
    shell = tmp_path / parent_name
    shutil.copy("/bin/sh", shell)
    parent = subprocess.Popen([str(shell), "-c", "sleep 30; :", parent_name, *args])
    try:
        for _ in range(200):
            children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
            if children:
                yield int(children[0])
                return
            time.sleep(0.01)
        pytest.fail("the stand-in runtime never started")
    finally:
        parent.kill()
        parent.wait()


def podmans(graph: str, run: str) -> list[str]:
    """conmon's arguments as podman gives them: the container's own words first, its exit command after."""
    words = ["-c", "ab" * 32, "-n", "web", "-p", "/tmp/anywhere/pidfile", "--exit-command", "/usr/bin/podman"]
    for word in ("--root", graph, "--runroot", run, "--log-level", "warning", "container", "cleanup", "ab" * 32):
        words += [EXIT, word]
    return words


def test_the_roots_come_from_conmons_exit_command(tmp_path: Path) -> None:
    with runtime_under("conmon", podmans("/var/lib/containers/storage", "/run/gck"), tmp_path) as pid:
        assert conmon_storage_roots(pid) == StorageRoots("/var/lib/containers/storage", "/run/gck")


def test_a_parent_that_is_not_conmon_gives_none(tmp_path: Path) -> None:
    with runtime_under("dockerd", podmans("/var/lib/containers/storage", "/run/gck"), tmp_path) as pid:
        assert conmon_storage_roots(pid) is None
    assert conmon_storage_roots(os.getpid()) is None  # pytest's parent


@pytest.mark.hostile("conmon's command line with a root named twice (a word of the container's config), or not "
                     "plain")
@pytest.mark.parametrize("args", [
    podmans("/var/lib/containers/storage", "/run/gck") + [EXIT, "--runroot", EXIT, "/tmp/evil"],
    podmans("/var/lib/containers/storage", "/run/../tmp"),
    podmans("relative", "/run/gck"),
    ["-p", EXIT, "--root", "/tmp/evil"],
])
def test_roots_named_twice_or_not_plain_give_none(args: list[str], tmp_path: Path) -> None:
    with runtime_under("conmon", args, tmp_path) as pid:
        assert conmon_storage_roots(pid) is None
