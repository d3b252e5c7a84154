"""A checkpoint into the store, as podman's export streams past: entries observed, files chunked.

`CheckpointWriter.observe` is copy_checked's seam (as the export signature's is): it hears of every
entry in order and returns a sink for each file's bytes, which cuts them into content-defined
chunks (store.chunking). Each chunk is hashed, looked up, and if the store lacks it compressed and
written, on a pool of threads (BLAKE3, zstd and the writes let go of the GIL) while the stream goes
on. `commit` waits for every chunk, syncs them to disk, then writes the manifest: a checkpoint
exists only once all it names is on disk. The caller holds the store's shared lock throughout, so
no collection removes a chunk this checkpoint counted on before its manifest names it.
"""

from __future__ import annotations

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

MAX_IN_FLIGHT = 64  # chunks queued or being stored (at most ~64 MiB, and the batches they are views of)

# (digest, bytes, bytes written to disk: 0 when the store had it)
StoredChunk = tuple[str, int, int]


def default_threads() -> int:
    """Four per CPU, at most 16: besides hashing and compressing, a chunk's write waits in the kernel
    (a new file, a rename, directory locks), which threads of their own overlap."""
    return min(16, 4 * len(os.sched_getaffinity(0)))


class ChunkWriteError(GpuckptError):
    """The store could not take a chunk (a full disk, a read-only store): named with the store's path, and
    not an OSError, which the archive reader would report as a corrupt archive."""


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
        except OSError as error:
            raise ChunkWriteError(f"{self.store.root}: {error.strerror or error}: cannot write a chunk of "
                                  f"{len(chunk)} bytes") from None
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
        self.store.sync()
        try:
            stored = StoredCheckpoint(name=name, container=container[:256], container_id=container_id,
                                      created=utc_now(), created_ns=time.time_ns(), entries=entries,
                                      logical_bytes=sum(entry.size for entry in entries), new_bytes=new_bytes,
                                      new_stored_bytes=new_stored)
        except ValidationError as error:  # the export named something the store cannot keep (a bad container ID)
            first = error.errors()[0]
            raise ImageError(f"checkpoint {name}: cannot be stored: {first['loc'][0]}: {first['msg']}") from None
        self.store.write_checkpoint(stored)
        return stored

    def discard(self) -> None:
        """Stop; the chunks already written stay until a collection finds nothing references them."""
        self._chunker = None
        self._pool.shutdown(cancel_futures=True)
