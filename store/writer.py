"""A checkpoint into the store, as podman's export streams past: entries observed, files chunked.

`CheckpointWriter.observe` is copy_checked's seam (as the export signature's is): it hears of every
entry in order and returns a sink for each file's bytes, which cuts them into content-defined
chunks (store.chunking). Each chunk is hashed, looked up, and if the store lacks it compressed and
written, on a pool of threads (BLAKE3, zstd and the writes let go of the GIL) while the stream goes
on. `commit` waits for every chunk, syncs them to disk, then writes the manifest: a checkpoint
exists only once all it names is on disk. The caller holds the store's shared lock throughout, so
no collection removes a chunk this checkpoint counted on before its manifest names it.

A checkpoint that fails is discarded, and the chunks it wrote are removed once the caller has let go
of the shared lock (`remove_written`: under the exclusive lock, so no other writer counts on them).
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from pydantic import ValidationError

from ..errors import GpuckptError, ImageError
from ..oci.timestamps import utc_now
from .chunking import Chunk, FileChunker, chunk_digest
from .manifest import StoredCheckpoint, StoredEntry
from .repository import Store

REMOVE_WAIT_S = 10.0  # for the exclusive lock, to remove a failed checkpoint's chunks (else left to prune)
MAX_IN_FLIGHT = 64  # chunks queued or being stored (at most ~64 MiB, and the batches they are views of)

# (digest, bytes, bytes written to disk: 0 when the store had it)
StoredChunk = tuple[str, int, int]


def default_threads() -> int:
    """Four per CPU, at most 16: besides hashing and compressing, a chunk's write waits in the kernel
    (a new file, a rename, directory locks), which threads of their own overlap."""
    return min(16, 4 * len(os.sched_getaffinity(0)))


class ChunkWriteError(GpuckptError):
    """The store could not take a chunk or the manifest (most often a full disk): the store's path and why."""


@dataclass
class _Entry:
    member: tarfile.TarInfo
    chunks: list[Future[StoredChunk]] = field(default_factory=list)


class CheckpointWriter:
    """One checkpoint being written; `observe` for copy_checked, then `commit` (or `discard`)."""

    def __init__(self, store: Store, threads: int = 0) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(threads or default_threads(), thread_name_prefix="gpuckpt-store")
        self._entries: list[_Entry] = []
        self._chunker: FileChunker | None = None
        self._in_flight: deque[Future[StoredChunk]] = deque()
        self._claimed: set[str] = set()  # digests this checkpoint has stored or is storing
        self._claim_lock = threading.Lock()
        self._written: list[str] = []  # digests of the chunks this checkpoint added to the store

    def observe(self, member: tarfile.TarInfo) -> FileChunker | None:
        """copy_checked's seam: every entry in order; a file's bytes go to the chunker returned."""
        self._close_file()
        entry = _Entry(member)
        self._entries.append(entry)
        if member.isdir():
            return None
        self._chunker = FileChunker(lambda chunk: self._submit(entry, chunk))
        return self._chunker

    def _close_file(self) -> None:
        if self._chunker is not None:
            self._chunker.close()
            self._chunker = None

    def _submit(self, entry: _Entry, chunk: Chunk) -> None:
        future = self._pool.submit(self._store_chunk, chunk)
        entry.chunks.append(future)
        self._in_flight.append(future)
        while len(self._in_flight) > MAX_IN_FLIGHT or (self._in_flight and self._in_flight[0].done()):
            self._in_flight.popleft().result()  # a failed write fails the stream here

    def _store_chunk(self, chunk: Chunk) -> StoredChunk:
        digest = chunk_digest(chunk)
        with self._claim_lock:
            claimed = digest in self._claimed
            self._claimed.add(digest)
        if claimed or self.store.has_chunk(digest):
            return digest, len(chunk), 0
        try:
            written = self.store.put_chunk(digest, chunk)
        except OSError as error:  # not the stream's fault: said as the store's, not as a corrupt archive
            raise ChunkWriteError(f"{self.store.root}: cannot store a chunk: {error.strerror or error}") from None
        self._written.append(digest)
        return digest, len(chunk), written

    def commit(self, name: str, container: str, container_id: str) -> StoredCheckpoint:
        """Every chunk on disk, then the manifest (the checkpoint exists from here)."""
        self._close_file()
        entries, new_bytes, new_stored = [], 0, 0
        for entry in self._entries:
            chunks = []
            for future in entry.chunks:
                digest, size, written = future.result()
                chunks.append((digest, size))
                if written:
                    new_bytes += size
                    new_stored += written
            member = entry.member
            try:
                entries.append(StoredEntry(name=member.name, type="dir" if member.isdir() else "file",
                                           mode=member.mode & 0o777, size=0 if member.isdir() else member.size,
                                           mtime=int(member.mtime) if 0 <= member.mtime < 2**33 else 0, chunks=chunks))
            except ValidationError as error:
                raise ImageError(f"checkpoint {name}: entry {member.name[:80]!r} cannot be stored: "
                                 f"{error.errors()[0]['msg']}") from None
        self._pool.shutdown()
        try:
            self.store.sync()
        except OSError as error:
            raise ChunkWriteError(f"{self.store.root}: cannot sync the chunks: {error.strerror or error}") from None
        try:
            stored = StoredCheckpoint(name=name, container=container[:256], container_id=container_id,
                                      created=utc_now(), created_ns=time.time_ns(), entries=entries,
                                      logical_bytes=sum(entry.size for entry in entries), new_bytes=new_bytes,
                                      new_stored_bytes=new_stored)
        except ValidationError as error:  # the export named something the store cannot keep (a bad container ID)
            first = error.errors()[0]
            raise ImageError(f"checkpoint {name}: cannot be stored: {first['loc'][0]}: {first['msg']}") from None
        try:
            self.store.write_checkpoint(stored)
        except OSError as error:
            raise ChunkWriteError(f"{self.store.root}: cannot write the manifest of {name}: "
                                  f"{error.strerror or error}") from None
        return stored

    def discard(self) -> None:
        """Stop (the chunks being written finish); `remove_written` then removes what this one added."""
        self._chunker = None
        self._pool.shutdown(cancel_futures=True)

    def remove_written(self, wait_s: float = REMOVE_WAIT_S) -> str:
        """After `discard`, the shared lock let go: the chunks this checkpoint added that no manifest names,
        removed under the exclusive lock (no writer counts on a chunk then); what became of them, as a clause
        ("" where it wrote none)."""
        if not self._written:
            return ""
        gone_bytes = 0
        try:
            with self.store.locked(exclusive=True, wait_s=wait_s):
                named = {digest for checkpoint in self.store.checkpoint_names()
                         for digest in self.store.read_checkpoint(checkpoint).digests()}
                for digest in set(self._written) - named:
                    with contextlib.suppress(FileNotFoundError):
                        gone_bytes += os.stat(self.store.chunk_name(digest), dir_fd=self.store.fd,
                                              follow_symlinks=False).st_size
                        self.store.remove_chunk(digest)
        except GpuckptError as error:  # busy (another checkpoint is written), or a manifest unreadable
            return (f"{len(self._written)} chunks it wrote are left in {self.store.root} ({error}); "
                    "the next `gpuckpt store prune` or `remove` collects them")
        self._written.clear()
        return f"the chunks it wrote removed ({gone_bytes / 2**20:.0f} MiB)"
