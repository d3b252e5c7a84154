"""podman's default (bridge) network through gpuckpt-runtime, as a node has it: netavark sets up the bridge and
its firewall (nft or iptables), aardvark-dns answers names on a network of ours. The forky root once lacked
nftables and aardvark-dns (--no-install-recommends) and every `podman run` on a network failed there."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest
from bed import PODMAN_IMAGE, sh

PREFIX = f"gpuckpt-parity-net-{os.getpid()}"
# One line on each connection, then close: enough to prove the packets came and went.
SERVER_SOURCE = """
import socket
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", 8080))
listener.listen()
while True:
    peer, _ = listener.accept()
    peer.sendall(b"gpuckpt-network-ok\\n")
    peer.close()
"""


@pytest.fixture
def containers() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


def _run_server(name: str, network: str, containers: list[str]) -> str:
    containers.append(name)
    sh("podman", "run", "-d", "--name", name, "--network", network, PODMAN_IMAGE, "python3", "-c", SERVER_SOURCE)
    return sh("podman", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
              name).stdout.strip()


def _answer(address: str, timeout_s: float = 30) -> bytes:
    """The server's line, asked from this network namespace (the node's, or the forky root's)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((address, 8080), timeout=5) as connection:
                return connection.recv(64)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # the server still starting


def test_container_on_the_default_network_is_reached_from_the_node(containers: list[str]) -> None:
    address = _run_server(f"{PREFIX}-server", "bridge", containers)
    assert address, "podman gave the container no address on its default network"
    assert _answer(address) == b"gpuckpt-network-ok\n"


def test_containers_reach_each_other_by_name_through_aardvark_dns(containers: list[str]) -> None:
    network = f"{PREFIX}-dns"
    sh("podman", "network", "create", network)  # a named network has DNS on; podman's default has it off
    try:
        server = f"{PREFIX}-named"
        _run_server(server, network, containers)
        client = f"{PREFIX}-client"
        containers.append(client)
        asked = sh("podman", "run", "--name", client, "--network", network, PODMAN_IMAGE, "python3", "-c",
                   "import socket, sys, time\n"
                   "for _ in range(100):\n"
                   "    try:\n"
                   f"        c = socket.create_connection(('{server}', 8080), timeout=5); break\n"
                   "    except OSError: time.sleep(0.2)\n"
                   "sys.stdout.write(c.recv(64).decode())\n")
        assert asked.stdout == "gpuckpt-network-ok\n"
    finally:
        for name in reversed(containers):
            sh("podman", "rm", "-f", "-t", "0", name, check=False)
        containers.clear()
        sh("podman", "network", "rm", "-f", network, check=False)
