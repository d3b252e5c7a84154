"""Retention: checkpoints removed (by name, or all but the newest N of each container), then the
chunks nothing references collected.

A collection holds the store's lock exclusively from its first read of the manifests to its last
removal; a checkpoint being written holds it shared from its first chunk to its manifest, so a
collection never sees a checkpoint half written: it waits for it (or gives up, with `wait_s`).
Besides, a chunk file changed after the collection began is kept whatever the manifests say.
A manifest that cannot be read stops the collection before anything is removed: its chunks would
go with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import GpuckptError, ImageError
from .manifest import StoredCheckpoint
from .repository import Store


@dataclass
class Collected:
    chunks: int = 0  # chunk files removed
    bytes: int = 0  # their bytes on disk
    kept_recent: int = 0  # unreferenced, but changed since the collection began
    temporaries: int = 0  # leftovers of checkpoints that never completed


def checkpoints(store: Store) -> list[StoredCheckpoint]:
    """Every checkpoint in the store, oldest first; a manifest that cannot be read is an ImageError."""
    return sorted((store.read_checkpoint(name) for name in store.checkpoint_names()),
                  key=lambda stored: (stored.created_ns, stored.name))


def to_prune(stored: list[StoredCheckpoint], keep: int, container: str | None = None) -> list[str]:
    """The names beyond the newest `keep` of each container (of `container` only, by name or ID, if given)."""
    by_container: dict[str, list[StoredCheckpoint]] = {}
    for checkpoint in sorted(stored, key=lambda item: (item.created_ns, item.name)):
        if container is None or container in (checkpoint.container, checkpoint.container_id):
            by_container.setdefault(checkpoint.container_id, []).append(checkpoint)
    return [checkpoint.name for group in by_container.values()
            for checkpoint in (group[:-keep] if keep else group)]


def collect(store: Store, wait_s: float | None = None) -> Collected:
    """Remove the chunks no checkpoint references (and what failed checkpoints left in tmp/)."""
    collected = Collected()
    with store.locked(exclusive=True, wait_s=wait_s):
        started_ns = time.time_ns()
        try:
            referenced = {digest for stored in checkpoints(store) for digest in stored.digests()}
        except GpuckptError as error:
            raise ImageError(f"cannot collect chunks: {error} (nothing was removed; remove or restore that "
                             "checkpoint's manifest first)") from None
        for digest, status in list(store.chunk_files()):
            if digest in referenced:
                continue
            if status.st_mtime_ns >= started_ns:
                collected.kept_recent += 1
                continue
            store.remove_chunk(digest)
            collected.chunks += 1
            collected.bytes += status.st_size
        for name, status in list(store.temporary_files()):
            if status.st_mtime_ns < started_ns:
                store.remove_temporary(name)
                collected.temporaries += 1
    return collected
