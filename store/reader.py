"""A stored checkpoint given back as the tar stream podman exported, every chunk verified on the way.

`StoredStream` is a ByteSource (readinto) that copy_checked reads like an archive: each entry's
header made again as gpuckpt's export makes it (oci.tarstream.write_header), then its chunks in
order, each read, decompressed and checked against its digest and size on a pool of threads a few
chunks ahead of the reader, then the padding and the end-of-archive blocks. A chunk that is missing
or corrupt ends the stream with one line naming the chunk and the entry it belongs to; whoever
reads the stream (restore, export) acts only once the whole of it has passed.
"""

from __future__ import annotations

import io
import tarfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from ..errors import ImageError
from ..oci import tarstream
from .manifest import StoredCheckpoint, StoredEntry
from .repository import ChunkError, Store
from .writer import default_threads

READ_AHEAD_PER_THREAD = 4


def entry_member(entry: StoredEntry) -> tarfile.TarInfo:
    member = tarfile.TarInfo(entry.name)
    member.type = tarfile.DIRTYPE if entry.type == "dir" else tarfile.REGTYPE
    member.size, member.mode, member.mtime = entry.size, entry.mode, entry.mtime
    return member


class StoredStream:
    """The checkpoint's tar stream, read with readinto (as copy_checked reads an archive)."""

    def __init__(self, store: Store, stored: StoredCheckpoint, threads: int = 0) -> None:
        self.store, self.stored = store, stored
        self.what = f"{store.root}: checkpoint {stored.name}"
        self._threads = threads or default_threads()
        self._pieces = self._stream()
        self._current = memoryview(b"")

    def readinto(self, buffer: memoryview) -> int:
        while not self._current:
            try:
                self._current = memoryview(next(self._pieces))
            except StopIteration:
                return 0
        count = min(len(buffer), len(self._current))
        buffer[:count] = self._current[:count]
        self._current = self._current[count:]
        return count

    def _stream(self) -> Iterator[bytes]:
        written = 0
        with ThreadPoolExecutor(self._threads, thread_name_prefix="gpuckpt-store-read") as pool:
            chunks = self._verified_chunks(pool)
            for entry in self.stored.entries:
                header = io.BytesIO()
                tarstream.write_header(entry_member(entry), header)
                yield header.getvalue()
                for _ in entry.chunks:
                    yield next(chunks)
                padding = -entry.size % tarstream.BLOCK if entry.type == "file" else 0
                if padding:
                    yield bytes(padding)
                written += len(header.getvalue()) + entry.size + padding
            end = io.BytesIO()
            tarstream.write_end(end, written)
            yield end.getvalue()

    def _verified_chunks(self, pool: ThreadPoolExecutor) -> Iterator[bytes]:
        """Every chunk of the checkpoint in order, read and checked a few ahead on `pool`."""
        refs = ((entry, digest, size) for entry in self.stored.entries for digest, size in entry.chunks)
        pending: deque[tuple[StoredEntry, Future[bytes]]] = deque()
        ahead = READ_AHEAD_PER_THREAD * self._threads
        for entry, digest, size in refs:
            pending.append((entry, pool.submit(self.store.read_chunk, digest, size)))
            if len(pending) >= ahead:
                yield self._result(*pending.popleft())
        while pending:
            yield self._result(*pending.popleft())

    def _result(self, entry: StoredEntry, future: Future[bytes]) -> bytes:
        try:
            return future.result()
        except ChunkError as error:
            raise ChunkError(f"{self.what}: {entry.name}: {error}: refused", error.digest) from None


def entry_bytes(store: Store, stored: StoredCheckpoint, name: str, limit: int) -> bytes | None:
    """One small file of the checkpoint (config.dump, spec.dump), verified; None if it has none."""
    for entry in stored.entries:
        if entry.name == name and entry.type == "file":
            if entry.size > limit:
                raise ImageError(f"{store.root}: checkpoint {stored.name}: {name} holds {entry.size} bytes, "
                                 f"more than {limit}")
            return b"".join(store.read_chunk(digest, size) for digest, size in entry.chunks)
    return None


def missing_chunks(store: Store, stored: StoredCheckpoint) -> list[str]:
    """The chunks it names that the store lacks (a look at each name, nothing read)."""
    return [digest for digest in stored.digests() if not store.has_chunk(digest)]


def verify_chunks(store: Store, digests: dict[str, int], threads: int = 0) -> dict[str, str]:
    """Every chunk read and checked; the bad ones, each with its one line."""
    bad: dict[str, str] = {}

    def check(digest: str, size: int) -> None:  # the bytes are dropped at once: only the verdict is kept
        store.read_chunk(digest, size)

    with ThreadPoolExecutor(threads or default_threads(), thread_name_prefix="gpuckpt-store-verify") as pool:
        futures = {digest: pool.submit(check, digest, size) for digest, size in digests.items()}
        for digest, future in futures.items():
            try:
                future.result()
            except ChunkError as error:
                bad[digest] = str(error)
    return bad
