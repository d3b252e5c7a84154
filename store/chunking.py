"""Content-defined chunks of a file's bytes, and their names.

FastCDC (pyfastcdc, FastCDC 2020 as nlfiedler/fastcdc-rs cuts) puts chunk boundaries where the
content says, not at fixed offsets: pages that moved within a pages image, or a file that grew in
the middle, still cut into the same chunks around the change. `FileChunker` takes a file's data as
it streams (any piece sizes) and cuts exactly as one pass over the whole file would. A chunk's name
is its BLAKE3 digest in hex: the only file names the store makes or accepts for chunks.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import blake3
from pyfastcdc import FastCDC

# Average 256 KiB (cut-point skipping makes it ~320 KiB): a 2 GiB checkpoint is ~7,000 chunks, a
# change of a few MiB costs about one chunk on each side of it.
AVERAGE_CHUNK_BYTES = 256 << 10
MIN_CHUNK_BYTES = 64 << 10
MAX_CHUNK_BYTES = 1 << 20
CUT_BATCH_BYTES = 16 << 20  # data gathered before a cut: fewer, larger calls into the chunker
DIGEST = re.compile(r"[0-9a-f]{64}")

Chunk = memoryview  # one chunk's bytes: a view that stays valid (its buffer is never written again)


def chunk_digest(data: Chunk | bytes) -> str:
    """The chunk's name: its BLAKE3 digest, 64 lowercase hex digits."""
    return blake3.blake3(data).hexdigest()


def chunker() -> FastCDC:
    return FastCDC(AVERAGE_CHUNK_BYTES, min_size=MIN_CHUNK_BYTES, max_size=MAX_CHUNK_BYTES)


class FileChunker:
    """One file's data, written in pieces (`write`), handed on chunk by chunk to `emit`; `close`
    cuts the rest. The cuts are those of one pass over the whole file: a chunk is cut only once at
    least MAX_CHUNK_BYTES follow its start (or the file has ended), so more data cannot move it."""

    def __init__(self, emit: Callable[[Chunk], None], cdc: FastCDC | None = None) -> None:
        self.emit, self.cdc = emit, cdc or chunker()
        self.pending = bytearray()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.pending += data
        self.size += len(data)
        if len(self.pending) >= CUT_BATCH_BYTES:
            self._cut(final=False)
        return len(data)

    def close(self) -> None:
        if self.pending:
            self._cut(final=True)

    def _cut(self, final: bool) -> None:
        gathered = self.pending  # never written again: the chunks handed on are views of it
        view = memoryview(gathered)
        rest = len(gathered)
        for piece in self.cdc.cut_buf(view):
            if not final and len(gathered) - piece.offset < MAX_CHUNK_BYTES:
                rest = piece.offset
                break
            self.emit(view[piece.offset:piece.offset + piece.length])
        else:
            rest = len(gathered)
        self.pending = bytearray(view[rest:])
