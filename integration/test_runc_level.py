"""An OCI bundle checkpointed and restored through gpuckpt-runtime at runc level."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bed import COUNTER_SOURCE, ROOTFS_TAR, RUNTIME, assert_continues, sh, wait_counter

RUNTIME_ROOT = "/run/gpuckpt-it"


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rootfs") / "rootfs"
    root.mkdir()
    sh("tar", "-C", str(root), "-xf", ROOTFS_TAR)
    return root


@pytest.fixture
def bundle(rootfs, tmp_path, delegate):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    sh(RUNTIME, "spec", cwd=bundle)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["python3", "-c", COUNTER_SOURCE]
    spec["root"] = {"path": str(rootfs), "readonly": False}
    (bundle / "config.json").write_text(json.dumps(spec))
    container_id = f"gpuckpt-it-{os.getpid()}-{delegate}"
    yield bundle, rootfs, container_id
    sh(RUNTIME, "--root", RUNTIME_ROOT, "delete", "-f", container_id, check=False)


def runtime(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return sh(RUNTIME, "--root", RUNTIME_ROOT, *argv, **kwargs)


def detached(*argv: str, cwd: Path) -> None:
    """Start a detached container. Its stdio is /dev/null (CRIU cannot dump host files or our
    pipes as a container's stdio), so the runtime's errors come through its --log file."""
    log = cwd / "runtime.log"
    with open(os.devnull, "r+b") as null:
        result = subprocess.run([RUNTIME, "--root", RUNTIME_ROOT, "--log", str(log), *argv], stdin=null,
                                stdout=null, stderr=null, cwd=cwd, timeout=120)
    assert result.returncode == 0, log.read_text() if log.exists() else f"exit {result.returncode}"


def test_bundle_checkpoint_restore(bundle, tmp_path) -> None:
    bundle_dir, rootfs, container_id = bundle
    (rootfs / "tmp" / "state").unlink(missing_ok=True)  # the rootfs is shared by the runc and crun runs
    detached("run", "-d", "--pid-file", str(tmp_path / "pid"), container_id, cwd=bundle_dir)
    read_state = lambda: (rootfs / "tmp" / "state").read_text()  # noqa: E731
    before = wait_counter(read_state, minimum=3)
    images = tmp_path / "images"
    runtime("checkpoint", "--image-path", str(images), container_id)
    assert runtime("state", container_id, check=False).returncode != 0  # gone after the dump
    pid_file = tmp_path / "restored.pid"
    detached("restore", "-d", "--bundle", str(bundle_dir), "--image-path", str(images),
             "--pid-file", str(pid_file), container_id, cwd=bundle_dir)
    state = json.loads(runtime("state", container_id).stdout)
    assert state["status"] == "running" and int(pid_file.read_text()) == state["pid"]
    assert_continues(before, read_state)


# The counter's buffer in a 6 MiB /dev/shm file that stays open after it is unlinked, the way
# NCCL's shared-memory transport holds its segments: CRIU must copy it into the image as a
# "ghost file", which it refuses above 1 MiB unless told (the shim raises the limit). The
# checksum is read back from the deleted file on every tick.
GHOST_BUFFER = (
    "fd = os.open('/dev/shm/segment', os.O_RDWR | os.O_CREAT, 0o600)\n"
    "os.write(fd, os.urandom(6 << 20))\n"
    "os.unlink('/dev/shm/segment')\n"
)


def test_deleted_shared_memory_is_carried_with_a_raised_ghost_limit(bundle, tmp_path) -> None:
    bundle_dir, rootfs, container_id = bundle
    spec = json.loads((bundle_dir / "config.json").read_text())
    source = COUNTER_SOURCE.replace("buffer = bytearray(os.urandom(16 << 20))\n", GHOST_BUFFER)
    source = source.replace("hashlib.sha256(buffer)", "hashlib.sha256(os.pread(fd, 6 << 20, 0))")
    assert source.count("os.pread") == 2
    spec["process"]["args"] = ["python3", "-c", source]
    (bundle_dir / "config.json").write_text(json.dumps(spec))
    (rootfs / "tmp" / "state").unlink(missing_ok=True)
    detached("run", "-d", container_id, cwd=bundle_dir)
    read_state = lambda: (rootfs / "tmp" / "state").read_text()  # noqa: E731
    before = wait_counter(read_state, minimum=3)
    images = tmp_path / "images"
    runtime("checkpoint", "--image-path", str(images), container_id)
    manifest = json.loads((images / "gpuckpt-manifest.json").read_text())
    assert manifest["criu_config"] == [f"ghost-limit {6 << 20}"]
    detached("restore", "-d", "--bundle", str(bundle_dir), "--image-path", str(images), container_id, cwd=bundle_dir)
    assert_continues(before, read_state)  # same token, and the mapped segment's checksum unchanged
