"""host/netns.py against a real network namespace (`unshare -n`, whose lo starts down)."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from gpuckpt.host.netns import in_netns_of, loopback_up

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace of its own needs root (unshare -n)")


def _inode(path: str) -> int:
    return os.stat(path).st_ino


@pytest.fixture
def namespaced():
    """A sleeping process in a new network namespace; its PID."""
    child = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    deadline = time.monotonic() + 10
    while _inode(f"/proc/{child.pid}/ns/net") == _inode("/proc/self/ns/net"):
        assert time.monotonic() < deadline, "unshare did not enter a new network namespace"
        time.sleep(0.01)
    yield child.pid
    child.kill()
    child.wait()


def test_lo_is_set_up_once_and_only_in_that_namespace(namespaced) -> None:
    ours = _inode("/proc/thread-self/ns/net")
    assert in_netns_of(namespaced, loopback_up) is True
    assert in_netns_of(namespaced, loopback_up) is False  # already up: nothing changed

    def reach_itself() -> int:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            with socket.create_connection(server.getsockname(), timeout=5):
                return _inode("/proc/thread-self/ns/net")

    assert reach_itself() == ours  # here, as ever
    assert in_netns_of(namespaced, reach_itself) == _inode(f"/proc/{namespaced}/ns/net")  # there, now reachable
    assert _inode("/proc/thread-self/ns/net") == ours  # the caller's thread never moved


def test_a_process_gone_is_an_error_not_another_namespace() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(ProcessLookupError):
        in_netns_of(child.pid, loopback_up)
