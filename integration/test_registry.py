"""A checkpoint moves between "nodes" through a real OCI registry and continues.

podman writes the checkpoint as an OCI image (--create-image), skopeo pushes it to Debian's
docker-registry on loopback, a second, separate podman storage root pulls it and restores
it through gpuckpt-runtime (the configured default), and the workload goes on from its
checkpointed state. The shim's manifest travels inside the image.
"""

from __future__ import annotations

import json
import os
import stat
import tarfile
from pathlib import Path

from bed import COUNTER_SOURCE, GPUCKPT, PODMAN_IMAGE, assert_continues, sh, wait_counter

from gpuckpt.oci.archive import decompressed


def manifest_in_image(remote: str, layout: Path) -> dict:
    """The shim's manifest, found in a layer of the checkpoint image as the registry serves it."""
    sh("skopeo", "copy", "--src-tls-verify=false", f"docker://{remote}", f"oci:{layout}:ckpt")
    for blob in (layout / "blobs" / "sha256").iterdir():
        try:
            with open(blob, "rb") as raw, tarfile.open(fileobj=decompressed(raw), mode="r|") as layer:
                for member in layer:
                    if member.name.endswith("gpuckpt-manifest.json"):
                        return json.loads(layer.extractfile(member).read())
        except tarfile.TarError:
            continue  # the image's JSON manifest and config blobs
    raise AssertionError("gpuckpt-manifest.json is not in the checkpoint image")


class SecondNode:
    """A second, separate podman storage root on this machine: another node, as far as podman knows."""

    def __init__(self, tmp_path: Path, label: str) -> None:
        # podman wants a runroot of at most 50 characters: a short one of our own, removed after.
        self.runroot = Path(f"/run/gck-node2-{os.getpid()}-{label}")
        self.podman = ["podman", "--root", str(tmp_path / "root2"), "--runroot", str(self.runroot)]

    def restore_from(self, remote: str) -> None:
        """The base image brought over, the checkpoint image pulled from the registry and restored."""
        sh("bash", "-c", f"podman save {PODMAN_IMAGE} | {' '.join(self.podman)} load")
        sh(*self.podman, "pull", "--tls-verify=false", remote)
        sh(*self.podman, "container", "restore", remote)

    def read_state(self, name: str):
        return lambda: sh(*self.podman, "exec", name, "cat", "/tmp/state").stdout

    def remove(self) -> None:
        sh(*self.podman, "rm", "-af", "-t", "0", check=False)
        sh("rm", "-rf", str(self.runroot), check=False)


def start_counter(name: str):
    sh("podman", "run", "-d", "--name", name, "--network", "none", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
    return wait_counter(lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout, minimum=3)


def test_checkpoint_image_moves_through_the_registry_to_another_storage_root(registry, delegate, tmp_path) -> None:
    name = f"gpuckpt-reg-{os.getpid()}-{delegate}"
    image = f"localhost/{name}-ckpt:1"
    remote = f"{registry}/{name}-ckpt:1"
    node2 = SecondNode(tmp_path, delegate)
    try:
        before = start_counter(name)
        sh("podman", "container", "checkpoint", "--create-image", image, name)
        summary = json.loads(sh(GPUCKPT, "inspect", "--json", image).stdout)  # read through podman image mount
        assert summary["kind"] == "podman-image" and summary["container"]["name"] == name
        assert summary["image"]["annotations"]["io.podman.annotations.checkpoint.name"] == name
        assert summary["manifest"]["container_id"] == summary["container"]["id"]
        sh("skopeo", "copy", "--dest-tls-verify=false", f"containers-storage:{image}", f"docker://{remote}")
        node2.restore_from(remote)
        assert_continues(before, node2.read_state(name))
        assert manifest_in_image(remote, tmp_path / "pulled")["schema_version"] == 1
    finally:
        node2.remove()
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
        sh("podman", "rmi", "-f", image, check=False)


def test_our_checkpoint_image_moves_through_the_registry_and_podman_restores_it(registry, runc_delegate,
                                                                                 tmp_path) -> None:
    """gpuckpt writes the image itself (OCI layout, zstd layer): skopeo pushes it, podman restores it."""
    name = f"gpuckpt-oci-{os.getpid()}"
    layout, remote = tmp_path / "layout", f"{registry}/{name}-ckpt:1"
    node2 = SecondNode(tmp_path, "oci")
    try:
        before = start_counter(name)
        sh(GPUCKPT, "export", name, "-o", f"oci:{layout}:ckpt")
        assert stat.S_IMODE(layout.stat().st_mode) == 0o700  # process memory: root only
        assert all(stat.S_IMODE(blob.stat().st_mode) == 0o600 for blob in (layout / "blobs" / "sha256").iterdir())
        summary = json.loads(sh(GPUCKPT, "inspect", "--json", f"oci:{layout}:ckpt").stdout)
        assert summary["container"]["name"] == name and summary["image"]["layer_media_type"].endswith("tar+zstd")
        assert summary["image"]["annotations"]["io.podman.annotations.checkpoint.name"] == name
        sh("skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:ckpt", f"docker://{remote}")
        node2.restore_from(remote)
        assert_continues(before, node2.read_state(name))
        assert manifest_in_image(remote, tmp_path / "pulled")["container_id"] == summary["manifest"]["container_id"]
    finally:
        node2.remove()
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


def test_our_checkpoint_image_carries_the_annotation_keys_podmans_does(runc_delegate, tmp_path) -> None:
    """The same container as an image twice, podman's (--create-image) and ours (export oci:): every key
    podman writes is in ours, and ours adds only gpuckpt's own, CRI-O's (which CRI-O's restore reads) and the
    image's creation time (podman 5 writes it, podman 4.3 does not)."""
    name = f"gpuckpt-keys-{os.getpid()}"
    image, layout = f"localhost/{name}-ckpt:1", tmp_path / "layout"
    try:
        start_counter(name)
        sh("podman", "container", "checkpoint", "--leave-running", "--create-image", image, name)
        sh(GPUCKPT, "export", "--leave-running", name, "-o", f"oci:{layout}:ckpt")
        podmans = json.loads(sh(GPUCKPT, "inspect", "--json", image).stdout)["image"]["annotations"]
        ours = json.loads(sh(GPUCKPT, "inspect", "--json", f"oci:{layout}:ckpt").stdout)["image"]["annotations"]
        assert set(podmans) <= set(ours), f"missing from ours: {sorted(set(podmans) - set(ours))}"
        added = set(ours) - set(podmans)
        known = ("io.gpuckpt.", "io.kubernetes.cri-o.annotations.checkpoint.", "org.opencontainers.image.created")
        assert all(key.startswith(known) for key in added), \
            sorted(added)
        assert ours["io.podman.annotations.checkpoint.name"] == podmans["io.podman.annotations.checkpoint.name"] == name
        print(f"podman's keys: {sorted(podmans)}; gpuckpt's own besides: {sorted(set(ours) - set(podmans))}")
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
        sh("podman", "rmi", "-f", image, check=False)
