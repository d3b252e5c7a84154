"""Forked children of CUDA processes let go of the driver: system calls run inside a real process.

The child here holds /dev/zero as the stand-in device (an open descriptor and a private
mapping) and sits blocked in a read, as a DataLoader worker waits on its queue; the release
closes and unmaps exactly those, and the blocked read carries on afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from fake_driver import FakeDriver

from gpuckpt.cuda.forked import CUDA_ERROR_NOT_INITIALIZED, device_hold, release_forked_children, split_forked_children
from gpuckpt.errors import DriverError, GpuCheckpointError
from gpuckpt.host import ptrace
from gpuckpt.host.procfs import start_time
from gpuckpt.host.ptrace import SYS_CLOSE, RemoteCallError, remote_syscalls

CHILD = textwrap.dedent("""
    import ctypes, mmap, os, sys
    if os.environ.get("TRACEME"):
        ctypes.CDLL(None).ptrace(0, 0, None, None)  # PTRACE_TRACEME: its parent, the test, traces it
    fd = os.open("/dev/zero", os.O_RDONLY)
    held = mmap.mmap(fd, 1 << 20, mmap.MAP_PRIVATE, mmap.PROT_READ)
    keep = os.open("/dev/null", os.O_RDONLY)
    print(fd, keep, flush=True)
    data = sys.stdin.buffer.read(5)             # blocked here while the parent works on us
    maps = open("/proc/self/maps").read()
    try:
        os.fstat(fd)
        state = "open"
    except OSError:
        state = "closed"
    print(data.decode(), state, "/dev/zero" in maps, os.path.exists(f"/proc/self/fd/{keep}"), flush=True)
""")


@pytest.fixture
def child(request):
    env = dict(os.environ, TRACEME="1") if getattr(request, "param", "") == "traced" else None
    process = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=env)
    fd, keep = map(int, process.stdout.readline().split())
    time.sleep(0.2)  # into the read
    yield process, fd, keep
    process.kill()
    process.wait()


def test_release_closes_and_unmaps_only_the_device_and_the_blocked_read_goes_on(child):
    process, fd, keep = child
    hold = device_hold(process.pid, "/dev/zero")
    assert fd in hold.fds and keep not in hold.fds and len(hold.mappings) == 1  # mmap keeps a dup of fd too

    holds = release_forked_children([process.pid], "/dev/zero")

    assert holds == [hold]
    assert device_hold(process.pid, "/dev/zero").fds == () and device_hold(process.pid, "/dev/zero").mappings == ()
    process.stdin.write("hello")
    process.stdin.flush()
    data, state, still_mapped, other_fd_open = process.stdout.readline().split()
    assert (data, state, still_mapped, other_fd_open) == ("hello", "closed", "False", "True")


def test_remote_syscall_returns_the_error_of_the_call(child):
    process, _, _ = child
    assert remote_syscalls(process.pid, start_time(process.pid), [(SYS_CLOSE, 987654)]) == [-9]  # EBADF, unharmed
    process.stdin.write("again")
    process.stdin.flush()
    assert process.stdout.readline().split()[0] == "again"


@pytest.mark.hostile("a forked child that ends and leaves its PID to another process before the release")
def test_a_process_that_is_not_the_one_chosen_is_refused_before_any_call(child):
    process, fd, _ = child
    with pytest.raises(RemoteCallError, match=rf"process {process.pid} is not the one chosen"):
        remote_syscalls(process.pid, start_time(process.pid) - 1, [(SYS_CLOSE, fd)])  # as if another had the PID
    assert fd in device_hold(process.pid, "/dev/zero").fds
    process.stdin.write("still")
    process.stdin.flush()
    assert process.stdout.readline().split()[:2] == ["still", "open"]


def test_stopped_child_is_refused_before_anything_changes(child):
    process, fd, _ = child
    os.kill(process.pid, 19)  # SIGSTOP
    try:
        deadline = time.monotonic() + 5
        while open(f"/proc/{process.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(GpuCheckpointError, match=r"forked child\(ren\) \d+ .* stopped .*SIGCONT"):
            release_forked_children([process.pid], "/dev/zero")
        assert fd in device_hold(process.pid, "/dev/zero").fds
    finally:
        os.kill(process.pid, 18)  # SIGCONT


@pytest.mark.parametrize("child", ["traced"], indirect=True)
def test_a_child_traced_by_another_process_is_one_line_with_the_workaround(child):
    process, fd, _ = child
    with pytest.raises(GpuCheckpointError, match=rf"forked child {process.pid} .* could not be made to let go of it "
                       r"\(cannot attach to process \d+: it is traced by another process\); .*'spawn'"):
        release_forked_children([process.pid], "/dev/zero")
    assert fd in device_hold(process.pid, "/dev/zero").fds


def test_a_child_that_ended_holds_nothing():
    assert device_hold(2 ** 22 + 7, "/dev/zero").fds == ()


def test_split_tells_forked_children_from_cuda_processes():
    driver = FakeDriver([10, 12], forked_pids=[11])
    assert split_forked_children(driver, [10, 11, 12]) == ([10, 12], [11])


def test_split_passes_other_driver_errors_on():
    driver = FakeDriver([10])
    with pytest.raises(DriverError) as raised:
        split_forked_children(driver, [10, 99])
    assert raised.value.cuda_error != CUDA_ERROR_NOT_INITIALIZED


VFORK_PARENT = textwrap.dedent("""
    import ctypes, mmap, os
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/dev/zero", os.O_RDONLY)
    held = mmap.mmap(fd, 1 << 20, mmap.MAP_PRIVATE, mmap.PROT_READ)
    print(flush=True)
    if libc.vfork() == 0:  # the child sleeps; the parent waits for it uninterruptibly (state D)
        libc.sleep(3600)
        libc._exit(0)
""")


@pytest.mark.hostile("a forked child of a CUDA process waiting uninterruptibly (vfork) so that ptrace never stops it")
def test_a_child_that_never_stops_is_refused_within_the_timeout(monkeypatch):
    monkeypatch.setattr(ptrace, "STOP_TIMEOUT_S", 0.5)
    parent = subprocess.Popen([sys.executable, "-c", VFORK_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        parent.stdout.readline()
        deadline = time.monotonic() + 5
        while open(f"/proc/{parent.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "D":
            assert time.monotonic() < deadline, "the vfork parent did not block"
            time.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(GpuCheckpointError, match=rf"process {parent.pid} did not stop within"):
            release_forked_children([parent.pid], "/dev/zero")
        assert time.monotonic() - started < 5
    finally:
        for child in open(f"/proc/{parent.pid}/task/{parent.pid}/children").read().split():
            os.kill(int(child), 9)
        parent.kill()
        parent.wait()
