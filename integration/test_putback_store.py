"""An interrupted or failed `gpuckpt store checkpoint` leaves no workload down and no chunks behind: with real
podman, the container it stopped runs again and goes on, the chunks it wrote are removed, and one line says so.

Ctrl-C (SIGINT) and SIGTERM at two phases: while podman checkpoints (CRIU dumping, before the stream) and
while chunks are written; and a store on a full filesystem (a tmpfs of a few MiB). The workload holds 256 MiB
of random data (chunks that do not compress) so that each phase lasts long enough to be hit.
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

pytestmark = pytest.mark.integration



@pytest.fixture
def big_counter(runc_delegate, request):
    name = podman_counter("putback", request.node.name)
    yield name
    sh("podman", "rm", "-f", "-t", "0", name, check=False)





def chunk_files(store: Path) -> list[Path]:
    return [path for path in (store / "chunks").rglob("*") if path.is_file()] if (store / "chunks").exists() else []


def checkpoint_dir(name: str) -> Path:
    # podman 4.3's inspect leaves .State.CheckpointPath empty until a checkpoint is made: its userdata, then
    return Path(sh("podman", "inspect", "--format", "{{.StaticDir}}", name).stdout.strip()) / "checkpoint"


def dumping(directory: Path) -> bool:
    return directory.exists() and any(image.suffix == ".img" for image in directory.iterdir())


def assert_nothing_kept(store: Path) -> None:
    assert chunk_files(store) == [], "chunks of the failed checkpoint were left"
    assert not (store / "checkpoints").exists() or os.listdir(store / "checkpoints") == []


@pytest.mark.parametrize("phase", ["checkpointing", "storing"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_store_checkpoint_puts_the_container_back(big_counter, tmp_path, phase, signum) -> None:
    name, store = big_counter, tmp_path / "store"
    before = wait_counter(read_state(name), minimum=3)
    images = checkpoint_dir(name)
    started = subprocess.Popen([GPUCKPT, "store", "checkpoint", name, "--store", str(store)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if phase == "checkpointing":
            wait_for(lambda: dumping(images), f"CRIU to start dumping into {images}")
            assert chunk_files(store) == [], "chunks were written before the signal: the phase was missed"
        else:
            wait_for(lambda: len(chunk_files(store)) > 3, "chunks to be written")
        assert started.poll() is None, "the checkpoint ended before the signal"
        started.send_signal(signum)
        _, stderr = started.communicate(timeout=300)
    finally:
        if started.poll() is None:
            started.kill()
    assert started.returncode == 128 + signum, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    kept = "; " if phase == "checkpointing" else ", the chunks it wrote removed ("
    assert lines[0].startswith(f"gpuckpt store: interrupted; no checkpoint stored{kept}"), stderr
    assert lines[0].endswith(f"; {name} restored from podman's checkpoint and running again"), stderr
    assert_nothing_kept(store)
    assert running(name)
    assert_continues(before, read_state(name))


@pytest.fixture
def full_filesystem(tmp_path):
    with small_filesystem(tmp_path / "full", "8m", "putback-full") as mount:
        yield mount


def test_store_on_a_full_filesystem_names_it_removes_its_chunks_and_puts_the_container_back(
        big_counter, full_filesystem) -> None:
    name, store = big_counter, full_filesystem / "store"
    before = wait_counter(read_state(name), minimum=3)
    result = sh(GPUCKPT, "store", "checkpoint", name, "--store", str(store), check=False, timeout=300)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gpuckpt store: {store}: cannot store a chunk: No space left on device; "
                               "no checkpoint stored, the chunks it wrote removed ("), lines
    assert lines[0].endswith(f"; {name} restored from podman's checkpoint and running again"), lines
    assert_nothing_kept(store)
    assert running(name)
    assert_continues(before, read_state(name))


def test_interrupted_leave_running_checkpoint_leaves_it_running(big_counter, tmp_path) -> None:
    name, store = big_counter, tmp_path / "store"
    before = wait_counter(read_state(name), minimum=3)
    started = subprocess.Popen([GPUCKPT, "store", "checkpoint", "--leave-running", name, "--store", str(store)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(chunk_files(store)) > 3, "chunks to be written")
        started.send_signal(signal.SIGINT)
        _, stderr = started.communicate(timeout=300)
    finally:
        if started.poll() is None:
            started.kill()
    assert started.returncode == 130, stderr
    assert stderr.strip().startswith("gpuckpt store: interrupted; no checkpoint stored, the chunks it wrote removed")
    assert stderr.strip().endswith(f"; {name} is still running"), stderr
    assert_nothing_kept(store)
    assert_continues(before, read_state(name))


def drain_record(name: str):
    from gpuckpt.node.container_record import ContainerRecord
    container_id = sh("podman", "inspect", "--format", "{{.Id}}", name).stdout.strip()
    return ContainerRecord(version=1, id=container_id, engine="podman", bundle="/nonexistent", pid=0, gpus=[],
                           created="2026-01-01T00:00:00Z")


def test_a_drain_past_its_time_stops_the_export_which_puts_the_container_back(big_counter, tmp_path,
                                                                              monkeypatch) -> None:
    """gpuckptd's drain (through_engine.checkpoint: `gpuckpt export`) used to kill an export past its time,
    leaving the container stopped: now the export is asked to stop, and puts it back."""
    from gpuckpt.host.programs import CommandError
    from gpuckpt.service import through_engine
    name, archive_dir = big_counter, tmp_path / "drained"
    archive_dir.mkdir(mode=0o700)
    record = drain_record(name)
    # how long this machine takes for the whole export (left running), then a limit inside it: past gpuckpt's start
    # (~1-2 s, before it may unwind) and before its end, whatever the machine's speed
    started = time.monotonic()
    sh(GPUCKPT, "export", "--leave-running", name, "-o", str(tmp_path / "whole.tar.zst"), timeout=300)
    whole_s = time.monotonic() - started
    (tmp_path / "whole.tar.zst").unlink()
    (tmp_path / "whole.tar.zst.sig").unlink(missing_ok=True)
    limit_s = max(2.5, round(whole_s * 0.6, 1))
    before = wait_counter(read_state(name), minimum=3)
    monkeypatch.setattr(through_engine, "ENGINE_TIMEOUT_S", limit_s)
    with pytest.raises(CommandError) as failed:
        through_engine.checkpoint(record, str(archive_dir))
    assert str(failed.value) == (f"gpuckpt export: no end within {limit_s:g} s, stopped: gpuckpt export: interrupted; "
                                 f"no archive written; {record.id} restored from podman's checkpoint and running again")
    assert os.listdir(archive_dir) == []
    assert running(name)
    assert_continues(before, read_state(name))


def test_a_drain_onto_a_full_filesystem_reports_the_container_put_back(big_counter, full_filesystem) -> None:
    from gpuckpt.host.programs import CommandError
    from gpuckpt.service import through_engine
    name = big_counter
    record = drain_record(name)
    before = wait_counter(read_state(name), minimum=3)
    with pytest.raises(CommandError) as failed:
        through_engine.checkpoint(record, str(full_filesystem))
    assert "No space left on device; no archive written; " in str(failed.value)
    assert str(failed.value).endswith(f"{record.id} restored from podman's checkpoint and running again")
    assert os.listdir(full_filesystem) == []
    assert running(name)
    assert_continues(before, read_state(name))
