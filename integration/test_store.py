"""The checkpoint store with real podman, runc and CRIU: a container with state checkpointed into the
store twice, restored from it and going on; a corrupted chunk refuses the restore, naming the chunk."""

from __future__ import annotations

import itertools
import json
import os
import stat
from pathlib import Path

import pytest
from bed import COUNTER_SOURCE, GPUCKPT, PODMAN_IMAGE, assert_continues, sh, small_filesystem, wait_counter

pytestmark = pytest.mark.integration
_names = itertools.count()


def podman_has(name: str) -> bool:
    return sh("podman", "container", "exists", name, check=False).returncode == 0


def staging_leftovers() -> set[str]:
    imports = Path("/run/gpuckpt/imports")
    return ({p for p in os.listdir("/var/lib/containers") if p.startswith(".gpuckpt-import-")}
            | (set(os.listdir(imports)) if imports.exists() else set()))


def read_state(name: str):
    return lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout


@pytest.fixture
def counter(runc_delegate):
    name = f"store-{os.getpid()}-{next(_names)}"
    sh("podman", "run", "-d", "--name", name, "--network", "none", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
    yield name
    sh("podman", "rm", "-f", "-t", "0", name, check=False)


@pytest.fixture
def store_dir(tmp_path) -> Path:
    return tmp_path / "store"


def store(store_dir: Path, *argv: str, check: bool = True):
    return sh(GPUCKPT, "store", *argv, "--store", str(store_dir), check=check, timeout=600)


def shown(store_dir: Path) -> dict[str, dict]:
    return {row["name"]: row for row in json.loads(store(store_dir, "show", "--json").stdout)["checkpoints"]}


def test_checkpointed_twice_restored_from_the_store_state_goes_on(counter, store_dir, tmp_path) -> None:
    name = counter
    wait_counter(read_state(name), minimum=3)
    first = store(store_dir, "checkpoint", name, "--leave-running", "--name", "first")
    assert "stored" in first.stdout and first.stderr == ""
    wait_counter(read_state(name), minimum=10)  # it went on after the first
    before = wait_counter(read_state(name), minimum=12)
    store(store_dir, "checkpoint", name, "--name", "second")  # this one stops it
    assert "Exited" in sh("podman", "ps", "-a", "--filter", f"name={name}", "--format", "{{.Status}}").stdout
    assert stat.S_IMODE(store_dir.stat().st_mode) == 0o700
    rows = shown(store_dir)
    # the workload's 16 MiB buffer and the interpreter are unchanged between the two
    assert rows["second"]["new_bytes"] < 0.5 * rows["first"]["new_bytes"]
    assert rows["second"]["shared_bytes"] > 0.5 * rows["second"]["logical_bytes"]
    listed = json.loads(store(store_dir, "list", "--json").stdout)["checkpoints"]
    assert [row["name"] for row in listed] == ["first", "second"] and listed[0]["container"] == name
    sh("podman", "rm", "-f", name)
    leftovers = staging_leftovers()  # others' imports may be running on this machine
    restored = store(store_dir, "restore", "second")
    assert f"restored {name}" in restored.stdout
    assert_continues(before, read_state(name))
    assert staging_leftovers() <= leftovers  # the staged pages were taken by the shim, the rest removed
    # the stored checkpoint as a signed archive, which gpuckpt's own checks accept
    archive = tmp_path / "second.tar.zst"
    store(store_dir, "export", "second", str(archive))
    assert "verified" in sh(GPUCKPT, "trust", "verify", str(archive)).stdout
    image = f"oci:{tmp_path / 'second-image'}:v1"  # and as podman's checkpoint image, its manifest signed
    store(store_dir, "export", "second", image)
    assert "layer sha256:" in sh(GPUCKPT, "trust", "verify", image).stdout
    assert "all intact" in store(store_dir, "verify").stdout
    pruned = store(store_dir, "prune", "--keep", "1")
    assert "removed first" in pruned.stdout
    assert list(shown(store_dir)) == ["second"] and "all intact" in store(store_dir, "verify").stdout


@pytest.mark.hostile("a stored checkpoint whose pages chunk has a flipped byte, then is missing, restored")
def test_a_corrupted_chunk_refuses_the_restore_naming_it(counter, store_dir) -> None:
    name = counter
    wait_counter(read_state(name), minimum=3)
    store(store_dir, "checkpoint", name, "--name", "only")
    sh("podman", "rm", "-f", name)
    manifest = json.loads((store_dir / "checkpoints" / "only.json").read_text())
    pages = next(entry for entry in manifest["entries"] if entry["name"].startswith("checkpoint/pages-"))
    digest = pages["chunks"][len(pages["chunks"]) // 2][0]
    chunk = store_dir / "chunks" / digest[:2] / digest
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    before = staging_leftovers()
    result = store(store_dir, "restore", "only", check=False)
    assert result.returncode == 3
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and digest in message and pages["name"] in message, message
    assert not podman_has(name)  # podman never ran
    assert staging_leftovers() <= before
    verified = store(store_dir, "verify", check=False)
    assert verified.returncode == 3 and digest in verified.stdout and "only cannot be restored" in verified.stderr
    chunk.unlink()  # missing now: named before any chunk is read
    missing = store(store_dir, "restore", "only", check=False)
    assert missing.returncode == 3 and digest in missing.stderr and "missing" in missing.stderr
    assert not podman_has(name)


@pytest.fixture
def full_store(tmp_path):
    """A store on a 4 MiB tmpfs: the counter's 16 MiB of random pages cannot fit."""
    with small_filesystem(tmp_path / "ops-full", "4m", "ops-full-store") as mount:
        yield mount / "store"


def test_checkpoint_onto_a_full_disk_names_the_store_and_removes_its_chunks(counter, full_store) -> None:
    """It said "truncated or corrupt archive: [Errno 28] ..." and left its chunks until a prune (issue 33)."""
    wait_counter(read_state(counter), minimum=3)
    result = store(full_store, "checkpoint", "--leave-running", counter, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gpuckpt store: {full_store}: cannot store a chunk: No space left on device"), lines
    left = [os.path.join(d, f) for d, _, files in os.walk(full_store / "chunks") for f in files]
    assert left == [] and os.listdir(full_store / "checkpoints") == []
    assert sh("podman", "inspect", "--format", "{{.State.Running}}", counter).stdout.strip() == "true"
