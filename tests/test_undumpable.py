"""Containers holding what CRIU cannot dump are refused before anything is touched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuckpt.errors import CheckpointRefusedError
from gpuckpt.host.processes import read_process
from gpuckpt.host.procfs import fd_targets
from gpuckpt.policy.undumpable import io_uring_holders, refuse_undumpable

# io_uring_setup(2) through libc's syscall(); params is struct io_uring_params (120 bytes).
RING_HOLDER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 4, params)
if fd < 0:
    print(f"no io_uring: {os.strerror(ctypes.get_errno())}", flush=True)
    sys.exit(0)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def ring_holder():
    child = subprocess.Popen([sys.executable, "-c", RING_HOLDER], stdout=subprocess.PIPE, text=True)
    answer = child.stdout.readline().strip()
    if answer != "ready":
        child.wait()
        pytest.skip(f"this kernel gives no io_uring to a test process ({answer}); the check cannot be shown here")
    yield child.pid
    child.kill()
    child.wait()


def test_a_process_with_an_io_uring_is_refused_with_the_fix(ring_holder) -> None:
    others = [os.getpid()]
    assert io_uring_holders(others + [ring_holder]) == [ring_holder]
    with pytest.raises(CheckpointRefusedError, match=f"process\\(es\\) {ring_holder} .*use io_uring.*USE_LIBUV=0"):
        refuse_undumpable("ctr", others + [ring_holder])


# A process holding what CRIU dumps, and looks like io_uring to a careless check: other anonymous inodes
# (eventfd, epoll), a memfd mapped, pipes and a socket.
ORDINARY_HOLDER = """
import mmap, os, select, socket, time
held = [os.eventfd(0), select.epoll(), os.pipe(), socket.socketpair()]
memfd = os.memfd_create("ring")
os.ftruncate(memfd, 4096)
mapped = mmap.mmap(memfd, 4096)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def ordinary_holder():
    child = subprocess.Popen([sys.executable, "-c", ORDINARY_HOLDER], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    yield child.pid
    child.kill()
    child.wait()


def test_ordinary_processes_pass(ordinary_holder) -> None:
    pids = [os.getpid(), os.getppid(), ordinary_holder]
    held = {target for pid, target in fd_targets([ordinary_holder])}
    assert {"anon_inode:[eventfd]", "anon_inode:[eventpoll]"} <= held  # what the check reads, seen
    assert any(target.startswith("/memfd:ring") for target in read_process(ordinary_holder).mappings)
    assert io_uring_holders(pids) == []
    refuse_undumpable("ctr", pids)  # no CheckpointRefusedError
