"""An interrupted or failed `gpuckpt export` leaves no workload down: with real podman, the container it
stopped runs again and goes on, no partial archive is left, and one line says what happened.

Ctrl-C (SIGINT) and SIGTERM at two phases: while podman checkpoints (CRIU dumping, before the stream)
and while the stream is written; and an export onto a full filesystem (a tmpfs of a few MiB).
The workload holds 256 MiB of random data so that each phase lasts long enough to be hit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from bed import (
    GPUCKPT,
    assert_continues,
    podman_counter,
    read_state,
    running,
    sh,
    small_filesystem,
    wait_counter,
    wait_for,
)


@pytest.fixture
def big_counter(runc_delegate, request):
    name = podman_counter("nosilence", request.node.name)
    yield name
    sh("podman", "rm", "-f", "-t", "0", name, check=False)





def dumping(checkpoint_dir: Path) -> bool:
    """CRIU writes images into podman's checkpoint directory (podman may make it, empty, before)."""
    return checkpoint_dir.exists() and any(image.suffix == ".img" for image in checkpoint_dir.iterdir())


def streaming(partial: Path) -> bool:
    return partial.exists() and partial.stat().st_size > 0


@pytest.mark.parametrize("phase", ["checkpointing", "streaming"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_export_puts_the_container_back(big_counter, tmp_path, phase, signum) -> None:
    name, archive = big_counter, tmp_path / "interrupted.tar.zst"
    partial = Path(f"{archive}.partial")
    before = wait_counter(read_state(name), minimum=3)
    # podman 4.3's inspect leaves .State.CheckpointPath empty until a checkpoint is made: its userdata, then
    checkpoint_dir = Path(sh("podman", "inspect", "--format", "{{.StaticDir}}", name).stdout.strip()) / "checkpoint"
    export = subprocess.Popen([GPUCKPT, "export", name, "-o", str(archive)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        if phase == "checkpointing":  # podman made its checkpoint directory: CRIU is dumping, no stream yet
            wait_for(lambda: dumping(checkpoint_dir), f"CRIU to start dumping into {checkpoint_dir}")
            assert not partial.exists(), "the stream began before the signal: the checkpointing phase was missed"
        else:
            wait_for(lambda: streaming(partial), f"{partial} to grow")
        assert export.poll() is None, "the export ended before the signal"
        export.send_signal(signum)
        _, stderr = export.communicate(timeout=300)
    finally:
        if export.poll() is None:
            export.kill()
    assert export.returncode == 128 + signum, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0] == f"gpuckpt export: interrupted; no archive written; {name} restored from podman's checkpoint " \
                       "and running again", stderr
    assert os.listdir(tmp_path) == [], "a partial archive was left"
    assert running(name)
    assert_continues(before, read_state(name))


@pytest.fixture
def full_filesystem(tmp_path):
    with small_filesystem(tmp_path / "full", "4m", "nosilence-full") as mount:
        yield mount


def test_export_onto_a_full_filesystem_names_it_and_puts_the_container_back(big_counter, full_filesystem) -> None:
    name, archive = big_counter, full_filesystem / "big.tar.zst"
    before = wait_counter(read_state(name), minimum=3)
    result = sh(GPUCKPT, "export", name, "-o", str(archive), check=False, timeout=300)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gpuckpt export: {archive}: No space left on device; no archive written; "), lines
    assert lines[0].endswith(f"{name} restored from podman's checkpoint and running again"), lines
    assert os.listdir(full_filesystem) == [], "a partial archive was left"
    assert running(name)
    assert_continues(before, read_state(name))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_export_with_leave_running_leaves_it_running(big_counter, tmp_path, signum) -> None:
    name, archive = big_counter, tmp_path / "left.tar.zst"
    before = wait_counter(read_state(name), minimum=3)
    export = subprocess.Popen([GPUCKPT, "export", "--leave-running", name, "-o", str(archive)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: streaming(Path(f"{archive}.partial")), "the stream to begin")
        export.send_signal(signum)
        _, stderr = export.communicate(timeout=300)
    finally:
        if export.poll() is None:
            export.kill()
    assert export.returncode == 128 + signum, stderr
    assert stderr.strip() == f"gpuckpt export: interrupted; no archive written; {name} is still running", stderr
    assert os.listdir(tmp_path) == []
    assert_continues(before, read_state(name))


def test_a_second_ctrl_c_still_puts_it_back(big_counter, tmp_path) -> None:
    """Ctrl-C twice while CRIU dumps: podman is not abandoned mid-checkpoint (killed, it left the container
    stopped and unrecorded); one more line says why gpuckpt waits, and the container is put back."""
    name, archive = big_counter, tmp_path / "twice.tar.zst"
    before = wait_counter(read_state(name), minimum=3)
    checkpoint_dir = Path(sh("podman", "inspect", "--format", "{{.StaticDir}}", name).stdout.strip()) / "checkpoint"
    export = subprocess.Popen([GPUCKPT, "export", name, "-o", str(archive)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: dumping(checkpoint_dir), f"CRIU to start dumping into {checkpoint_dir}")
        export.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert export.poll() is None, "the export ended before the second Ctrl-C"
        export.send_signal(signal.SIGINT)
        _, stderr = export.communicate(timeout=300)
    finally:
        if export.poll() is None:
            export.kill()
    assert export.returncode == 130, stderr
    assert stderr.strip().splitlines() == [
        f"gpuckpt export: waiting for podman to finish its checkpoint of {name}, to put it back",
        f"gpuckpt export: interrupted; no archive written; {name} restored from podman's checkpoint and running again"]
    assert os.listdir(tmp_path) == []
    assert running(name)
    assert_continues(before, read_state(name))


def test_interrupted_export_to_an_image_layout_leaves_no_blobs(big_counter, tmp_path) -> None:
    name, layout = big_counter, tmp_path / "layout"
    before = wait_counter(read_state(name), minimum=3)
    export = subprocess.Popen([GPUCKPT, "export", name, "-o", f"oci:{layout}:interrupted"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(blob.is_file() and blob.stat().st_size > 0 for blob in layout.glob("blobs/*/*")),
                 "the layout's layer blob to grow")
        export.send_signal(signal.SIGINT)
        _, stderr = export.communicate(timeout=300)
    finally:
        if export.poll() is None:
            export.kill()
    assert export.returncode == 130, stderr
    assert stderr.strip() == f"gpuckpt export: interrupted; no archive written; {name} restored from podman's " \
                             "checkpoint and running again", stderr
    assert os.listdir(tmp_path) == [], "the layout's partial blobs were left"
    assert_continues(before, read_state(name))
