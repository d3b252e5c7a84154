"""The shim's CRIU config file and the ghost-limit it chooses, against real processes."""

from __future__ import annotations

import itertools
import os

import pytest
import test_gpu_verbs
from support import ready_children, write_config

from gpuckpt.errors import CheckpointRefusedError
from gpuckpt.host.processes import read_processes
from gpuckpt.node.config import CriuConfig
from gpuckpt.shim.criuconf import ghost_limit_of, network_lock_lines, use_criu_config

make_node = test_gpu_verbs.make_node  # the fake node, its runtime and its driver (fixtures)
CAP = CriuConfig().max_ghost_bytes  # the default, 512 MiB

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
    with ready_children() as start:
        names = itertools.count()
        yield lambda size, how="mapped": start(HOLDER, str(tmp_path / f"segment{next(names)}"), str(size), how)


def test_auto_raises_the_limit_to_the_largest_deleted_file_in_whole_mib(holder) -> None:
    pids = [holder(3 << 20), holder((5 << 20) + 1, "open")]
    limit, why = ghost_limit_of("auto", read_processes(pids), CAP)
    assert limit == 6 << 20
    assert "deleted file(s) still held, the largest" in why and "segment1 of 5 MiB" in why, why


def test_auto_leaves_small_files_to_criu_default(holder) -> None:
    assert ghost_limit_of("auto", read_processes([holder(512 << 10)]), CAP) == (0, "")


def test_memfd_is_not_a_ghost_file(holder) -> None:
    assert ghost_limit_of("auto", read_processes([holder(8 << 20, "memfd")]), 1 << 20) == (0, "")


def test_the_operator_setting_wins(holder) -> None:
    assert ghost_limit_of(0, read_processes([holder(8 << 20)]), 1 << 20) == (0, "set by criu.ghost_limit")
    assert ghost_limit_of(64 << 20, read_processes([]), CAP) == (64 << 20, "set by criu.ghost_limit")


@pytest.mark.hostile("a container holding a deleted-but-open file larger than criu.max_ghost_bytes (CRIU would copy "
                     "it whole into the image)")
def test_auto_refuses_a_deleted_file_above_the_cap(holder) -> None:
    held = read_processes([holder((3 << 20) + 5)])
    assert ghost_limit_of("auto", held, CAP)[0] == 4 << 20  # under the default cap: raised, as before
    with pytest.raises(CheckpointRefusedError) as refused:
        ghost_limit_of("auto", held, 2 << 20)
    line = str(refused.value)
    assert "segment0" in line and "is deleted but still held, 3145733 bytes (3 MiB), above criu.max_ghost_bytes " \
        "(2097152 bytes) in " in line and "\n" not in line, line
    assert ghost_limit_of(4 << 20, held, 2 << 20) == (4 << 20, "set by criu.ghost_limit")  # the operator's number


def test_a_checkpoint_over_the_cap_is_refused_before_anything_is_frozen_or_locked(make_node, node, holder) -> None:
    made = make_node(2)
    write_config(node, "[criu]\nmax_ghost_bytes = 2097152\n")
    ghost = holder(3 << 20)  # one more process of the container, holding the file
    made.set_runtime(pids=[*made.pids, ghost])
    with pytest.raises(CheckpointRefusedError, match=r"^checkpoint of ctr refused: .*segment0' is deleted but still "
                       r"held, 3145728 bytes \(3 MiB\), above criu.max_ghost_bytes \(2097152 bytes\) in .*config.toml"):
        made.checkpoint()
    assert made.driver.calls == [] and made.all_running()  # the driver never asked: nothing locked
    assert "checkpoint" not in made.verbs_called()
    write_config(node, "")
    assert made.checkpoint() == 0  # the default cap takes it


def test_vanished_processes_are_skipped() -> None:
    assert ghost_limit_of("auto", read_processes([2**22 + 1]), CAP) == (0, "")


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
