"""What the store holds, for `gpuckpt store list` and `show`: per checkpoint its logical size, the
bytes it added to the store when it was written, and the bytes it shares with other checkpoints now."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .manifest import StoredCheckpoint
from .reader import verify_chunks
from .repository import Store
from .retention import checkpoints


@dataclass
class CheckpointUsage:
    name: str
    container: str
    created: str
    logical_bytes: int  # its files' bytes
    new_bytes: int  # of them, in chunks the store did not have when it was written
    new_stored_bytes: int  # those chunks, compressed
    shared_bytes: int  # of its distinct chunks' bytes, those another checkpoint references too
    unique_bytes: int  # of its distinct chunks' bytes, those only it references (what removing it frees)


@dataclass
class StoreUsage:
    checkpoints: list[CheckpointUsage]
    logical_bytes: int  # all checkpoints' logical sizes added up: what they would take as archives, uncompressed
    chunk_bytes: int  # the distinct chunks' bytes
    stored_bytes: int  # the chunk files on disk
    chunks: int


def usage(store: Store, stored: list[StoredCheckpoint] | None = None) -> StoreUsage:
    stored = checkpoints(store) if stored is None else stored
    references: Counter[str] = Counter()
    sizes: dict[str, int] = {}
    for checkpoint in stored:
        digests = checkpoint.digests()
        references.update(digests.keys())
        sizes.update(digests)
    rows = []
    for checkpoint in stored:
        digests = checkpoint.digests()
        shared = sum(size for digest, size in digests.items() if references[digest] > 1)
        rows.append(CheckpointUsage(checkpoint.name, checkpoint.container, checkpoint.created,
                                    checkpoint.logical_bytes, checkpoint.new_bytes, checkpoint.new_stored_bytes,
                                    shared, sum(digests.values()) - shared))
    files = list(store.chunk_files())
    return StoreUsage(rows, sum(row.logical_bytes for row in rows), sum(sizes.values()),
                      sum(status.st_size for _, status in files), len(files))


@dataclass
class Verified:
    checkpoints: int
    chunks: int  # distinct chunks referenced, each read and checked
    chunk_bytes: int
    bad: dict[str, str]  # digest -> its one line
    referenced_by: dict[str, list[str]]  # digest -> the checkpoints that name it (bad ones only)
    unreferenced: int  # chunk files no checkpoint names (a collection removes them)


def verify_store(store: Store, names: list[str] | None = None, threads: int = 0) -> Verified:
    """Every chunk of every checkpoint (or of `names`) read, decompressed and checked against its name."""
    with store.locked():
        stored = [store.read_checkpoint(name) for name in names] if names else checkpoints(store)
        digests: dict[str, int] = {}
        users: dict[str, list[str]] = {}
        for checkpoint in stored:
            for digest, size in checkpoint.digests().items():
                digests[digest] = size
                users.setdefault(digest, []).append(checkpoint.name)
        bad = verify_chunks(store, digests, threads)
        unreferenced = 0 if names else sum(1 for digest, _ in store.chunk_files() if digest not in digests)
    return Verified(len(stored), len(digests), sum(digests.values()), bad,
                    {digest: users[digest] for digest in bad}, unreferenced)
