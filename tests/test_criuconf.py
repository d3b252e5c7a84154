"""The shim's CRIU config file and the ghost-limit it chooses, against real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuckpt.host.processes import read_processes
from gpuckpt.shim.criuconf import ghost_limit_of, network_lock_lines, use_criu_config

HOLDER = """
import mmap, os, sys, time
path, size, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if how == "memfd":
    fd = os.memfd_create("segment")
else:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, size)
mapping = mmap.mmap(fd, size)
if how != "memfd":
    os.unlink(path)
if how == "mapped":
    os.close(fd)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path):
    children = []

    def start(size: int, how: str = "mapped") -> int:
        child = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path / f"segment{len(children)}"), str(size), how],
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(child)
        assert child.stdout.readline().strip() == "ready"
        return child.pid

    yield start
    for child in children:
        child.kill()
        child.wait()


def test_auto_raises_the_limit_to_the_largest_deleted_file_in_whole_mib(holder) -> None:
    pids = [holder(3 << 20), holder((5 << 20) + 1, "open")]
    limit, why = ghost_limit_of("auto", read_processes(pids))
    assert limit == 6 << 20
    assert "deleted file(s) still held, the largest" in why and "segment1 of 5 MiB" in why, why


def test_auto_leaves_small_files_to_criu_default(holder) -> None:
    assert ghost_limit_of("auto", read_processes([holder(512 << 10)])) == (0, "")


def test_memfd_is_not_a_ghost_file(holder) -> None:
    assert ghost_limit_of("auto", read_processes([holder(8 << 20, "memfd")])) == (0, "")


def test_the_operator_setting_wins(holder) -> None:
    assert ghost_limit_of(0, read_processes([holder(8 << 20)])) == (0, "set by criu.ghost_limit")
    assert ghost_limit_of(64 << 20, read_processes([])) == (64 << 20, "set by criu.ghost_limit")


def test_vanished_processes_are_skipped() -> None:
    assert ghost_limit_of("auto", read_processes([2**22 + 1])) == (0, "")


def test_config_file_is_named_by_its_content_and_root_only(node, monkeypatch) -> None:
    # setenv first: monkeypatch then restores the variable's absence after the test, so
    # later tests' subprocesses (real CRIU) do not inherit this file
    monkeypatch.setenv("CRIU_CONFIG_FILE", "")
    monkeypatch.delenv("CRIU_CONFIG_FILE")
    first = use_criu_config(["network-lock nftables", "ghost-limit 2097152"])
    assert os.environ["CRIU_CONFIG_FILE"] == first
    assert open(first).read() == "network-lock nftables\nghost-limit 2097152\n"
    assert os.stat(first).st_mode & 0o777 == 0o600
    second = use_criu_config(["network-lock nftables"])
    assert second != first and open(first).read().count("\n") == 2  # the first is never rewritten
    assert network_lock_lines("iptables") == [] and network_lock_lines("nftables") == ["network-lock nftables"]
