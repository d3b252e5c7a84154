"""An established TCP connection survives checkpoint/restore through the shim.

The server runs in a container joined to a network namespace this test creates; the
client runs in a second namespace of the test's own, linked by a veth pair with
addresses inside those namespaces only. The shim finds the connection through
sock_diag and adds --tcp-established (and again on restore, from the manifest); the
client must see every numbered message acknowledged once, in order, on one connection.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from bed import CONFIG, PODMAN_IMAGE, ROOTFS_TAR, RUNTIME, sh

HERE = Path(__file__).parent
SERVER = (HERE / "workloads" / "ack_server.py").read_text()
CLIENT = HERE / "workloads" / "ack_client.py"
SERVER_ADDRESS, CLIENT_ADDRESS, PORT, MESSAGES = "10.231.7.1", "10.231.7.2", 7000, 60
RUNTIME_ROOT = "/run/gpuckpt-it-tcp"


@pytest.fixture
def namespaces():
    """Two network namespaces joined by a veth pair; removed by name afterwards."""
    tag = f"{os.getpid() % 100000}"
    server_ns, client_ns = f"gck-srv-{tag}", f"gck-cli-{tag}"
    sh("ip", "netns", "add", server_ns)
    sh("ip", "netns", "add", client_ns)
    try:
        sh("ip", "link", "add", f"gs{tag}", "netns", server_ns, "type", "veth", "peer", "name", f"gc{tag}",
           "netns", client_ns)
        for ns, device, address in ((server_ns, f"gs{tag}", SERVER_ADDRESS), (client_ns, f"gc{tag}", CLIENT_ADDRESS)):
            sh("ip", "-n", ns, "addr", "add", f"{address}/30", "dev", device)
            sh("ip", "-n", ns, "link", "set", device, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield server_ns, client_ns
    finally:
        sh("ip", "netns", "del", server_ns, check=False)
        sh("ip", "netns", "del", client_ns, check=False)


def start_client(client_ns: str, record: Path) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", client_ns, "python3", str(CLIENT), SERVER_ADDRESS, str(PORT),
                             str(MESSAGES), str(record)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_acks(record: Path, count: int, timeout_s: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = record.read_text().splitlines() if record.exists() else []
        if len(lines) >= count or any(line.startswith(("ERROR", "EOF")) for line in lines):
            return lines
        time.sleep(0.1)
    raise AssertionError(f"only {len(lines)} acknowledgements within {timeout_s} s: {lines[-3:]}")


def assert_one_unbroken_conversation(lines: list[str]) -> None:
    assert lines[-1] == "DONE", f"the connection broke: {lines[-3:]}"
    assert lines[:-1] == [f"ack {n}" for n in range(1, MESSAGES + 1)], "lost, repeated or reordered messages"


@pytest.fixture
def bundle(tmp_path, namespaces, delegate):
    server_ns, _ = namespaces
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True)
    sh("tar", "-C", str(rootfs), "-xf", ROOTFS_TAR)
    sh(RUNTIME, "spec", cwd=bundle)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"].update(terminal=False, args=["python3", "-c", SERVER, SERVER_ADDRESS, str(PORT)])
    spec["linux"]["namespaces"] = [ns for ns in spec["linux"]["namespaces"] if ns["type"] != "network"]
    spec["linux"]["namespaces"].append({"type": "network", "path": f"/run/netns/{server_ns}"})
    (bundle / "config.json").write_text(json.dumps(spec))
    container_id = f"gpuckpt-tcp-{os.getpid()}-{delegate}"
    yield bundle, container_id
    sh(RUNTIME, "--root", RUNTIME_ROOT, "delete", "--force", container_id, check=False)


def runtime(bundle: Path, *argv: str) -> None:
    log = bundle / "runtime.log"
    with open(os.devnull, "r+b") as null:
        result = subprocess.run([RUNTIME, "--root", RUNTIME_ROOT, "--log", str(log), *argv], cwd=bundle,
                                stdin=null, stdout=null, stderr=null, timeout=120)
    assert result.returncode == 0, log.read_text() if log.exists() else f"exit {result.returncode}"


@pytest.mark.parametrize("network_lock", ["iptables", "nftables"])
def test_connection_survives_at_runc_level(bundle, namespaces, tmp_path, network_lock) -> None:
    bundle_dir, container_id = bundle
    if network_lock != "iptables":
        with CONFIG.open("a") as config:
            config.write(f'[criu]\nnetwork_lock = "{network_lock}"\n')
    runtime(bundle_dir, "run", "-d", container_id)
    time.sleep(0.5)  # the server listens
    record = tmp_path / "acks"
    client = start_client(namespaces[1], record)
    try:
        assert len(wait_acks(record, 10)) >= 10
        images = tmp_path / "images"
        runtime(bundle_dir, "checkpoint", "--image-path", str(images), container_id)  # no option given
        manifest = json.loads((images / "gpuckpt-manifest.json").read_text())
        assert manifest["network"]["added_options"] == ["--tcp-established"]
        assert manifest["network"]["network_lock"] == network_lock
        # runc has no flag for it: CRIU got the method from the shim's own config file
        assert manifest["criu_config"] == ([] if network_lock == "iptables" else [f"network-lock {network_lock}"])
        parsed = re.search(r"/criu-[0-9a-f]{16}\.conf", (images / "dump.log").read_text())
        assert bool(parsed) == (network_lock == "nftables")
        assert any(f"{SERVER_ADDRESS}:{PORT}" in c for c in manifest["network"]["tcp_connected"])
        time.sleep(1)  # the client keeps sending into the locked connection
        runtime(bundle_dir, "restore", "-d", "--image-path", str(images), "--bundle", str(bundle_dir), container_id)
        assert_one_unbroken_conversation(wait_acks(record, MESSAGES + 1, timeout_s=120))
    finally:
        client.kill()
        client.wait()


def test_connection_survives_podman(namespaces, tmp_path, delegate) -> None:
    server_ns, client_ns = namespaces
    name = f"gpuckpt-tcp-{os.getpid()}-{delegate}"
    podman = ["podman", "--runtime", "gpuckpt-runtime"]
    record = tmp_path / "acks"
    client = None
    try:
        sh(*podman, "run", "-d", "--name", name, "--network", f"ns:/run/netns/{server_ns}", PODMAN_IMAGE,
           "python3", "-c", SERVER, SERVER_ADDRESS, str(PORT))
        time.sleep(1)
        client = start_client(client_ns, record)
        assert len(wait_acks(record, 10)) >= 10
        sh(*podman, "container", "checkpoint", name)
        time.sleep(1)
        sh(*podman, "container", "restore", name)
        assert_one_unbroken_conversation(wait_acks(record, MESSAGES + 1, timeout_s=120))
    finally:
        if client:
            client.kill()
            client.wait()
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


# A client and a server in one container, on 127.0.0.1: each exchange is counted in /tmp/count
LOOPBACK_PAIR = """
import os, socket, time
server = socket.create_server(("127.0.0.1", 5555))
client = socket.create_connection(("127.0.0.1", 5555))
peer, _ = server.accept()
count = 0
while True:
    client.sendall(count.to_bytes(4, "big"))
    assert int.from_bytes(peer.recv(4), "big") == count
    count += 1
    with open("/tmp/count.new", "w") as out:
        out.write(str(count))
    os.replace("/tmp/count.new", "/tmp/count")  # a reader never sees it empty
    time.sleep(0.05)
"""


def test_loopback_connections_of_a_network_none_container_survive_podman() -> None:
    """podman --network none gives the container a network namespace runc makes; runc's restore makes it again
    empty, `lo` down, and CRIU cannot connect the loopback connections back ("Can't connect inet socket back:
    Network is unreachable": plain runc under podman 4.3.1 too, without gpuckpt-hook). The hook, which runc's
    restore runs in CRIU's setup-namespaces callback, sets `lo` up: the one connection carries on."""
    name = f"gpuckpt-tcp-lo-{os.getpid()}"
    podman = ["podman", "--runtime", "gpuckpt-runtime"]

    def count() -> int:
        return int(sh("podman", "exec", name, "cat", "/tmp/count").stdout or 0)

    try:
        sh(*podman, "run", "-d", "--name", name, "--network", "none", PODMAN_IMAGE, "python3", "-c", LOOPBACK_PAIR)
        deadline = time.monotonic() + 30
        while sh("podman", "exec", name, "cat", "/tmp/count", check=False).returncode != 0 or count() < 5:
            assert time.monotonic() < deadline, "the pair did not start"
            time.sleep(0.2)
        sh(*podman, "container", "checkpoint", "--tcp-established", name)
        assert sh("podman", "inspect", "--format", "{{.State.Status}}", name).stdout.strip() == "exited"
        restored = sh(*podman, "container", "restore", "--tcp-established", name, check=False)
        assert restored.returncode == 0, restored.stderr
        before = count()
        time.sleep(1)
        assert count() > before  # the same connection goes on (the workload asserts every exchange)
        assert sh("podman", "inspect", "--format", "{{.State.Status}}", name).stdout.strip() == "running"
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
