"""CRIU network options from what the sockets are doing: real sockets read through sock_diag."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys

import pytest

from gpuckpt.errors import ConfigError
from gpuckpt.host.processes import read_processes
from gpuckpt.node.config import CriuConfig
from gpuckpt.policy.network import SocketsFound, choose, container_policy, inspect_sockets, missing_option_hint

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sock_diag in another netns needs CAP_SYS_ADMIN (setns)")


@needs_root
def test_finds_our_established_and_listening_tcp_and_locks(tmp_path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    lock_file = open(tmp_path / "lock", "w")
    fcntl.flock(lock_file, fcntl.LOCK_EX)
    try:
        found = inspect_sockets(os.getpid(), read_processes([os.getpid()]))
        assert not found.unreadable
        port = server.getsockname()[1]
        assert any(f":{port}" in where for where in found.tcp_listening)
        assert len([c for c in found.tcp_connected if f":{port}" in c]) == 2  # both ends are ours
        assert found.file_locks >= 1
    finally:
        for each in (client, peer, server, lock_file):
            each.close()


@needs_root
def test_sockets_of_other_processes_are_not_counted() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    try:
        found = inspect_sockets(os.getpid(), read_processes([1]))  # PID 1's sockets only
        assert not any(f":{server.getsockname()[1]}" in where for where in found.tcp_listening)
    finally:
        server.close()


def test_auto_adds_only_what_is_needed_and_keeps_the_engines_options() -> None:
    found = SocketsFound(tcp_connected=["10.0.0.1:80 -> 10.0.0.2:5000 state 1"], tcp_remote=1, file_locks=1)
    chosen = choose(found, {"file-locks"}, CriuConfig())
    assert chosen.added_options == ["--tcp-established"]
    assert chosen.engine_options == ["--file-locks"]
    assert choose(SocketsFound(), set(), CriuConfig()).added_options == []


def test_auto_leaves_loopback_only_connections_to_fail_safely() -> None:
    found = SocketsFound(tcp_connected=["127.0.0.1:80 -> 127.0.0.1:5000 state 1"], tcp_remote=0)
    chosen = choose(found, set(), CriuConfig())
    assert chosen.added_options == []
    assert "criu.tcp_established = \"always\"" in missing_option_hint(chosen, set())


@needs_root
def test_loopback_connections_are_told_apart() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        found = inspect_sockets(os.getpid(), read_processes([os.getpid()]))
        assert found.tcp_connected and found.tcp_remote == 0
    finally:
        for each in (client, peer, server):
            each.close()


def test_never_adds_nothing_and_the_failure_says_what_to_enable() -> None:
    found = SocketsFound(tcp_connected=["10.0.0.1:80 -> 10.0.0.2:5000 state 1"], tcp_remote=1)
    chosen = choose(found, set(), CriuConfig(tcp_established="never"))
    assert chosen.added_options == []
    hint = missing_option_hint(chosen, set())
    assert "1 established TCP connection(s)" in hint and "--tcp-established" in hint


def test_always_adds_even_without_connections() -> None:
    assert choose(SocketsFound(), set(), CriuConfig(tcp_established="always")).added_options == ["--tcp-established"]


def test_a_container_annotation_chooses_a_tighter_policy() -> None:
    policy = container_policy(CriuConfig(tcp_established="always"), {"io.gpuckpt.criu.tcp-established": "auto"})
    assert policy.tcp_established == "auto" and policy.network_lock == "iptables"
    found = SocketsFound(tcp_connected=["127.0.0.1:80 -> 127.0.0.1:5000 state 1"], tcp_remote=0)
    assert choose(found, set(), policy).added_options == []


def test_a_bad_annotation_value_names_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match="annotation io.gpuckpt.criu.file-locks='yes': Input should be 'auto' or "
                                          "'never'"):
        container_policy(CriuConfig(), {"io.gpuckpt.criu.file-locks": "yes"})


def test_each_kind_of_file_lock_a_process_holds_is_counted(tmp_path) -> None:
    """POSIX (lockf), OFD and flock locks all count; a file merely open does not (CRIU's file-locks option)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"d = {str(tmp_path)!r}\n"
        "opened = [open(os.path.join(d, name), 'w') for name in ('posix', 'flock', 'plain')]\n"
        "fcntl.lockf(opened[0], fcntl.LOCK_EX)\n"
        "fcntl.flock(opened[1], fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert read_processes([holder.pid]).file_locks == 2
        assert read_processes([os.getpid()]).file_locks == 0
    finally:
        holder.kill()
        holder.wait()
