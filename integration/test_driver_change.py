"""The driver changed under the checkpoint, on real runc and CRIU (issue 32 item 4, CPU): a container whose process
maps a driver library bind-mounted at its host path as a CDI spec mounts it (a stand-in libcuda.so.550.54.15: a copy
of the image's libBrokenLocale, which the loader maps through LD_PRELOAD) is checkpointed through gpuckpt-runtime;
its restore under the config another node's spec would give it (the files of 560.35.05) is refused before runc runs,
and the container is restored, going on from its state, under its own config."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from bed import (
    COUNTER_SOURCE,
    RUNTIME,
    RUNTIME_ROOT,
    assert_continues,
    detached,
    make_bundle,
    runtime,
    sh,
    wait_counter,
)

OLD, NEW = "550.54.15", "560.35.05"
LIB_DIR = "/opt/gpuckpt-it-driver/lib"  # inside the container: a folder of this module's own rootfs copy
STAND_IN = "usr/lib/x86_64-linux-gnu/libBrokenLocale.so.1"  # a small library of the image's (its python has no mmap)


def driver_files(root: Path, version: str, rootfs: Path) -> Path:
    """A node's driver libraries of `version` in `root` (its host folder): loadable stand-ins."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("libcuda.so", "libnvidia-ml.so"):
        (root / f"{name}.{version}").write_bytes((rootfs / STAND_IN).read_bytes())
    return root


def cdi_mounts(host: Path, version: str) -> list[dict]:
    """One bind mount per driver file at its path, as an engine applies nvidia-ctk's spec (docs/cdi.md)."""
    return [{"destination": f"{LIB_DIR}/{name}.{version}", "source": str(host / f"{name}.{version}"), "type": "bind",
             "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]} for name in ("libcuda.so", "libnvidia-ml.so")]


def restore(bundle: Path, images: Path, container_id: str, tmp_path: Path) -> tuple[int, str]:
    log = tmp_path / "restore.log"
    log.write_text("")
    with open(os.devnull, "r+b") as null:  # a detached container inherits the stdio: CRIU cannot dump our pipes
        result = subprocess.run([RUNTIME, "--root", RUNTIME_ROOT, "--log", str(log), "restore", "-d", "--bundle",
                                 str(bundle), "--image-path", str(images), "--pid-file",
                                 str(tmp_path / "restored.pid"), container_id],
                                stdin=null, stdout=null, stderr=null, cwd=bundle, timeout=120)
    return result.returncode, log.read_text()


@pytest.fixture
def container(rootfs, tmp_path, runc_delegate):
    container_id = f"gpuckpt-it-drvchg-{os.getpid()}"
    bundle = make_bundle(rootfs, tmp_path)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["args"] = ["python3", "-c", COUNTER_SOURCE]
    spec["process"]["env"].append(f"LD_PRELOAD={LIB_DIR}/libcuda.so.{OLD}")  # mapped as a CUDA process maps it
    own = driver_files(tmp_path / "node-a" / "lib", OLD, rootfs)
    spec["mounts"] += cdi_mounts(own, OLD)
    (bundle / "config.json").write_text(json.dumps(spec))
    (rootfs / "tmp" / "state").unlink(missing_ok=True)
    yield bundle, rootfs, container_id
    sh(RUNTIME, "--root", RUNTIME_ROOT, "delete", "-f", container_id, check=False)


def test_another_nodes_driver_is_refused_before_runc_and_the_same_driver_restores(container, tmp_path) -> None:
    bundle, rootfs, container_id = container
    detached("run", "-d", container_id, cwd=bundle)
    read_state = lambda: (rootfs / "tmp" / "state").read_text()  # noqa: E731
    before = wait_counter(read_state, minimum=3)
    images = tmp_path / "images"
    runtime("checkpoint", "--image-path", str(images), container_id)
    recorded = json.loads((images / "gpuckpt-manifest.json").read_text())["driver_files"]
    assert recorded == [{"path": f"{LIB_DIR}/libcuda.so.{OLD}", "version": OLD,
                         "host_path": str(tmp_path / "node-a" / "lib" / f"libcuda.so.{OLD}")}]

    own = (bundle / "config.json").read_text()
    other = json.loads(own)
    other["mounts"] = [m for m in other["mounts"] if not m["destination"].startswith(LIB_DIR)]
    other["mounts"] += cdi_mounts(driver_files(tmp_path / "node-b" / "lib", NEW, rootfs), NEW)
    (bundle / "config.json").write_text(json.dumps(other))
    status, said = restore(bundle, images, container_id, tmp_path)
    assert status == 1, said
    assert (f"its processes run NVIDIA driver {OLD} (they map {LIB_DIR}/libcuda.so.{OLD}), this restore's config "
            f"brings driver {NEW}'s files") in said
    assert not (images / "restore.log").exists()  # refused before runc ran CRIU (which logs there)
    assert runtime("state", container_id, check=False).returncode != 0  # nothing was restored

    (bundle / "config.json").write_text(own)
    status, said = restore(bundle, images, container_id, tmp_path)
    assert status == 0, said
    assert json.loads(runtime("state", container_id).stdout)["status"] == "running"
    assert_continues(before, read_state)
