"""Retention with real files: prune and remove, the chunks collected, and a checkpoint written meanwhile."""

from __future__ import annotations

import io
import os
import random
import threading
import time

import pytest
from podman_tars import podman_tar

from gpuckpt.errors import ImageError
from gpuckpt.oci.podman_archive import copy_checked
from gpuckpt.store.reader import verify_chunks
from gpuckpt.store.repository import Store, StoreBusy
from gpuckpt.store.retention import checkpoints, collect, to_prune
from gpuckpt.store.writer import CheckpointWriter

CONTAINER_ID = "c0ffee" * 10 + "abcd"


def tar_of(seed: int, shared: bytes) -> bytes:
    return podman_tar([("checkpoint/pages-2.img", shared + random.Random(seed).randbytes(2 << 20))])


def put(store: Store, tar: bytes, name: str, container_id: str = CONTAINER_ID) -> None:
    writer = CheckpointWriter(store, threads=2)
    with store.locked():
        copy_checked(io.BytesIO(tar), None, name, observe=writer.observe)
        writer.commit(name, "web", container_id)


@pytest.fixture
def store(tmp_path) -> Store:
    with Store(str(tmp_path / "store")) as opened:
        yield opened


def chunk_set(store: Store) -> set[str]:
    return {digest for digest, _ in store.chunk_files()}


def test_prune_keeps_the_newest_and_collects_only_what_nothing_references(store) -> None:
    shared = random.Random(0).randbytes(4 << 20)
    for number in range(4):
        put(store, tar_of(number, shared), f"web-{number}")
    put(store, tar_of(9, shared), "db-0", container_id="d" * 64)
    before = chunk_set(store)
    gone = to_prune(checkpoints(store), keep=2)
    assert gone == ["web-0", "web-1"]  # per container: db's only one stays
    assert to_prune(checkpoints(store), keep=1, container="web") == ["web-0", "web-1", "web-2"]
    for name in gone:
        store.remove_checkpoint(name)
    time.sleep(0.01)
    collected = collect(store, wait_s=0)
    after = chunk_set(store)
    assert collected.chunks == len(before - after) > 0 and collected.bytes > 2 << 20
    left = {digest: size for stored in checkpoints(store) for digest, size in stored.digests().items()}
    assert set(left) == after  # every referenced chunk stays, nothing else does
    assert verify_chunks(store, left) == {}
    assert collect(store, wait_s=0).chunks == 0


def test_collection_waits_for_a_checkpoint_being_written(store) -> None:
    """A checkpoint that has written its chunks but not yet its manifest: a collection cannot start
    (StoreBusy, or it waits), and once the manifest is there every chunk it names is kept."""
    shared = random.Random(1).randbytes(4 << 20)
    put(store, tar_of(1, shared), "web-1")
    store.remove_checkpoint("web-1")  # its chunks are garbage now, and the next checkpoint reuses some
    writer = CheckpointWriter(store, threads=2)
    chunks_written, commit = threading.Event(), threading.Event()

    def checkpoint() -> None:
        with store.locked():
            copy_checked(io.BytesIO(tar_of(2, shared)), None, "web-2", observe=writer.observe)
            chunks_written.set()
            commit.wait(30)
            writer.commit("web-2", "web", CONTAINER_ID)

    thread = threading.Thread(target=checkpoint)
    thread.start()
    assert chunks_written.wait(30)
    with pytest.raises(StoreBusy, match="a checkpoint is being written"):
        collect(store, wait_s=0.2)
    results = []
    collector = threading.Thread(target=lambda: results.append(collect(store)))
    collector.start()
    time.sleep(0.5)
    assert collector.is_alive() and not results  # waiting for the checkpoint
    commit.set()
    thread.join(30)
    collector.join(30)
    stored = store.read_checkpoint("web-2")
    assert verify_chunks(store, stored.digests()) == {}  # the shared chunks it reused were kept
    assert results[0].chunks > 0  # web-1's own chunks went


def test_a_chunk_newer_than_the_collection_is_kept(store) -> None:
    put(store, tar_of(3, b""), "web-1")
    store.remove_checkpoint("web-1")
    future = time.time() + 3600
    recent = sorted(chunk_set(store))[0]
    os.utime(os.path.join(store.root, store.chunk_name(recent)), (future, future))
    collected = collect(store, wait_s=0)
    assert collected.kept_recent == 1 and chunk_set(store) == {recent}


def test_an_unreadable_manifest_stops_the_collection(store) -> None:
    put(store, tar_of(4, b""), "web-1")
    put(store, tar_of(5, b""), "web-2")
    with open(os.path.join(store.root, "checkpoints", "web-2.json"), "w") as broken:
        broken.write("{")
    before = chunk_set(store)
    with pytest.raises(ImageError, match="cannot collect chunks.*web-2.*nothing was removed"):
        collect(store, wait_s=0)
    assert chunk_set(store) == before


def test_leftovers_of_a_failed_checkpoint_are_collected(store) -> None:
    writer = CheckpointWriter(store, threads=2)
    with store.locked():
        copy_checked(io.BytesIO(tar_of(6, b"")), None, "web-1", observe=writer.observe)
        writer.discard()  # the stream failed: no manifest
    with open(os.path.join(store.root, "tmp", "x" * 64 + ".1.2"), "wb") as partial:
        partial.write(b"half a chunk")
    partial = os.path.join(store.root, "chunks", "ab", "ab" * 32 + ".7.8.partial")  # a chunk half written
    with open(partial, "wb") as half:
        half.write(b"half")
    for path in (os.path.join(store.root, "tmp", "x" * 64 + ".1.2"), partial):
        os.utime(path, (1, 1))
    assert chunk_set(store)
    collected = collect(store, wait_s=0)
    assert chunk_set(store) == set() and collected.temporaries == 2 and not os.path.exists(partial)
