"""One read of a container's processes (host/processes.py), against real processes."""

from __future__ import annotations

import os
import subprocess
import sys

from gpuckpt.host.processes import read_container, read_processes

HOLDER = """
import fcntl, mmap, os, socket, subprocess, sys, time
d = sys.argv[1]
ghost = os.open(os.path.join(d, "ghost"), os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(ghost, 3 << 20)
os.unlink(os.path.join(d, "ghost"))
linked = os.open(os.path.join(d, "temporary"), os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(linked, 4096)
os.link(os.path.join(d, "temporary"), os.path.join(d, "real"))
os.unlink(os.path.join(d, "temporary"))
locked = open(os.path.join(d, "lock"), "w")
fcntl.flock(locked, fcntl.LOCK_EX)
pair = socket.socketpair()
child = subprocess.Popen(["sleep", "60"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_one_read_holds_files_locks_sockets_deleted_files_and_children(tmp_path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert holder.stdout is not None
        child = int(holder.stdout.readline())
        processes = read_container([], holder.pid)
        assert processes.pids == sorted([holder.pid, child])
        (read,) = [process for process in processes if process.pid == holder.pid]
        assert read.children == (child,)
        assert read.file_locks == 1 and processes.file_locks == 1
        assert len(read.socket_inodes) == 2
        assert processes.deleted_file_sizes()[str(tmp_path / "ghost")] == 3 << 20
        assert str(tmp_path / "temporary") not in processes.deleted_file_sizes()
        assert str(tmp_path / "temporary") in processes.deleted_but_linked()
        assert str(tmp_path / "ghost") not in processes.deleted_but_linked()
        assert any(path.endswith("libc.so.6") or "python" in path for path in read.mappings)
        assert processes.container_pid(holder.pid) == holder.pid  # the test runs in the host's PID namespace
    finally:
        if child:
            os.kill(child, 9)
        holder.kill()
        holder.wait()


def test_a_vanished_process_is_read_as_holding_nothing() -> None:
    (gone,) = read_processes([2**22 + 1])
    assert gone.fd_targets == frozenset() and gone.file_locks == 0
    assert gone.mappings == () and gone.deleted_files == () and gone.children == ()
    assert os.getpid() in read_processes([os.getpid()]).pids
