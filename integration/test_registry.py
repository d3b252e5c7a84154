"""A checkpoint moves between "nodes" through a real OCI registry and continues.

podman writes the checkpoint as an OCI image (--create-image), skopeo pushes it to Debian's
docker-registry on loopback, a second, separate podman storage root pulls it and restores
it through gpuckpt-runtime (the configured default), and the workload goes on from its
checkpointed state. The shim's manifest travels inside the image.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from bed import COUNTER_SOURCE, PODMAN_IMAGE, assert_continues, sh, wait_counter


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def registry(tmp_path):
    port = free_port()
    (tmp_path / "data").mkdir()
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    server = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=10)


def manifest_in_image(remote: str, layout: Path) -> dict:
    """The shim's manifest, found in a layer of the checkpoint image as the registry serves it."""
    sh("skopeo", "copy", "--src-tls-verify=false", f"docker://{remote}", f"oci:{layout}:ckpt")
    for blob in (layout / "blobs" / "sha256").iterdir():
        try:
            with tarfile.open(blob) as layer:  # gzip, or plain tar
                for member in layer:
                    if member.name.endswith("gpuckpt-manifest.json"):
                        return json.loads(layer.extractfile(member).read())
        except tarfile.TarError:
            continue  # the image's JSON manifest and config blobs
    raise AssertionError("gpuckpt-manifest.json is not in the checkpoint image")


def test_checkpoint_image_moves_through_the_registry_to_another_storage_root(registry, delegate, tmp_path) -> None:
    name = f"gpuckpt-reg-{os.getpid()}-{delegate}"
    image = f"localhost/{name}-ckpt:1"
    remote = f"{registry}/{name}-ckpt:1"
    # podman wants a runroot of at most 50 characters: a short one of our own, removed after.
    runroot = Path(f"/run/gck-node2-{os.getpid()}-{delegate}")
    node2 = ["podman", "--root", str(tmp_path / "root2"), "--runroot", str(runroot)]
    try:
        sh("podman", "run", "-d", "--name", name, "--network", "none", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
        before = wait_counter(lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout, minimum=3)
        sh("podman", "container", "checkpoint", "--create-image", image, name)
        sh("skopeo", "copy", "--dest-tls-verify=false", f"containers-storage:{image}", f"docker://{remote}")
        # The second node: its own storage, the base image brought over, the checkpoint pulled.
        sh("bash", "-c", f"podman save {PODMAN_IMAGE} | {' '.join(node2)} load")
        sh(*node2, "pull", "--tls-verify=false", remote)
        sh(*node2, "container", "restore", remote)
        read_state = lambda: sh(*node2, "exec", name, "cat", "/tmp/state").stdout  # noqa: E731
        assert_continues(before, read_state)
        assert manifest_in_image(remote, tmp_path / "pulled")["schema_version"] == 1
    finally:
        sh(*node2, "rm", "-af", "-t", "0", check=False)
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
        sh("podman", "rmi", "-f", image, check=False)
        sh("rm", "-rf", str(runroot), check=False)
