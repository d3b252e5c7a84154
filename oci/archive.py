"""The compressed stream of a checkpoint archive: opened for one sequential read, decompressed
(zstd or gzip, each frame and block header checked as it passes, so a truncated or corrupt
stream is an ImageError), and the multithreaded zstd compressor archives are written with.
The tar inside is oci/tarstream.py's; podman's layout of it, oci/podman_archive.py's.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Callable, Generator
from typing import IO, BinaryIO, Protocol, cast

import zstandard

from ..errors import GpuckptError, ImageError, NotFoundError
from ..host.direct_read import DirectReader
from .tarstream import ByteSource, Data

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DEFAULT_LEVEL = 1  # speed first: checkpoint images are large and mostly incompressible or zero
# What a decompressor reads from the archive at a time (zstd here; gzip reads less): the
# granularity at which an entry's compressed bytes are known (RatioGuard, below).
READ_BYTES = 128 << 10


GZIP_MAGIC = b"\x1f\x8b"
ZSTD_SKIPPABLE = range(0x184D2A50, 0x184D2A60)


class RawArchive(ByteSource, Protocol):
    """The archive file as `decompressed` reads it: its magic, a seek back to the start, then once through."""

    def read(self, size: int = -1, /) -> bytes: ...

    def seek(self, offset: int, whence: int = os.SEEK_SET, /) -> int: ...

    def fileno(self) -> int: ...


# what _zstd_headers yields: (count, skip, may_end)
HeaderStep = tuple[int, bool, bool]


def _zstd_headers(corrupt: Callable[[str], ImageError]) -> Generator[HeaderStep, bytes, None]:
    """The frame and block headers of a zstd stream (RFC 8878), as a coroutine fed the stream's
    bytes in order: it yields (count, skip, may_end) for what comes next, count bytes to be sent
    to it (skip False) or passed over unseen (skip True, then sent b""); may_end says whether the
    stream may end before them. Block contents (and their checksums) are the decompressor's to check."""
    frame_magic = int.from_bytes(ZSTD_MAGIC, "little")
    while True:
        magic = int.from_bytes((yield 4, False, True), "little")
        if magic in ZSTD_SKIPPABLE:
            length = int.from_bytes((yield 4, False, False), "little")
            if length:
                yield length, True, False
            continue
        if magic != frame_magic:
            raise corrupt("bytes after the last zstd frame")
        descriptor = (yield 1, False, False)[0]
        single_segment, has_checksum = descriptor >> 5 & 1, descriptor >> 2 & 1
        content_size_bytes = (single_segment, 2, 4, 8)[descriptor >> 6]
        dictionary_bytes = (0, 1, 2, 4)[descriptor & 3]
        yield (0 if single_segment else 1) + dictionary_bytes + content_size_bytes, True, False
        last = False
        while not last:
            header = int.from_bytes((yield 3, False, False), "little")
            last, kind, block_size = bool(header & 1), header >> 1 & 3, header >> 3
            if kind == 3:
                raise corrupt("a reserved zstd block type")
            if size := 1 if kind == 1 else block_size:
                yield size, True, False
        if has_checksum:
            yield 4, True, False


class ZstdFrameCheck:
    """A zstd stream passed through to the decompressor, its headers followed on the way:
    python-zstandard's stream reader ends quietly where a cut stream ends (a missing content
    checksum included); a stream that ends inside a frame is an ImageError here instead."""

    def __init__(self, raw: RawArchive) -> None:
        self.raw = raw
        self.name: str = getattr(raw, "name", "archive")
        self._headers = _zstd_headers(self._corrupt)
        self._need, self._skip, self._may_end = next(self._headers)
        self._pending = bytearray()

    def _corrupt(self, why: str) -> ImageError:
        return ImageError(f"{self.name}: truncated or corrupt archive: {why}")

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        if data:
            self._follow(memoryview(data))
        elif not self._may_end or self._pending:
            raise self._corrupt("the zstd stream ends inside a frame")
        return data

    def _follow(self, data: memoryview) -> None:
        at = 0
        while at < len(data):
            if self._skip:
                taken = min(self._need, len(data) - at)
                at, self._need = at + taken, self._need - taken
                if self._need:
                    return
                self._need, self._skip, self._may_end = self._headers.send(b"")
                continue
            taken = min(self._need - len(self._pending), len(data) - at)
            self._pending += data[at:at + taken]
            at += taken
            if len(self._pending) < self._need:
                return
            header = bytes(self._pending)
            self._pending.clear()
            self._need, self._skip, self._may_end = self._headers.send(header)


def decompressed(raw: RawArchive) -> ByteSource:
    """A readable stream of the tar inside `raw`: zstd (ours, podman's default), gzip, or none."""
    magic = raw.read(4)
    raw.seek(0)
    if magic == ZSTD_MAGIC:
        checked = cast(IO[bytes], ZstdFrameCheck(raw))  # a reader: read() is all stream_reader uses
        return zstandard.ZstdDecompressor().stream_reader(checked, read_across_frames=True, read_size=READ_BYTES)
    if magic[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


def open_archive(path: str) -> DirectReader:
    """The archive file, opened for one sequential read (transfer.direct_read: around the page
    cache); an ImageError names it if it cannot be."""
    try:
        return DirectReader(path)
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None
    except PermissionError as error:  # the reader's lack, not the archive's: an I/O error, not a refusal
        raise GpuckptError(f"{path}: cannot read: {error.strerror}") from None
    except OSError as error:  # not a regular file (a FIFO, a directory), or the read failed: refused
        raise ImageError(f"{path}: cannot read: {error.strerror}") from None


def zstd_compressor(threads: int = 0, level: int = DEFAULT_LEVEL) -> zstandard.ZstdCompressor:
    """Multithreaded zstd (`threads` 0: one per CPU) with a checksum, which makes a corrupted
    archive an error rather than corrupted process memory."""
    return zstandard.ZstdCompressor(level=level, threads=threads or os.cpu_count() or 1, write_checksum=True)


def close_quietly(*streams: BinaryIO | None) -> None:
    """Close what a failed write left open; already failing, their own errors add nothing."""
    for stream in streams:
        try:
            if stream is not None:
                stream.close()
        except Exception:  # noqa: BLE001 -- cleanup after a failure: a close's own error would hide that one
            pass


class HashingWriter:
    """A write-only stream that hashes and counts what passes through to `out`."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.hash, self.size = out, hashlib.sha256(), 0

    def write(self, data: Data) -> int:
        self.hash.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()

    @property
    def digest(self) -> str:
        return f"sha256:{self.hash.hexdigest()}"


class RatioGuard:
    """Bounds how far each entry expands: `consumed()` tells the compressed bytes read so far, of
    `total_bytes`. An entry declaring more than the rest of the archive could expand into is
    refused at its header; one that expands too far as it is read, as soon as it does."""

    def __init__(self, path: str, consumed: Callable[[], int], max_ratio: int, read_bytes: int,
                 total_bytes: int | None = None) -> None:
        self.path, self.consumed, self.max_ratio, self.total_bytes = path, consumed, max_ratio, total_bytes
        self.read_bytes = read_bytes  # what the decompressor may have read ahead of the entry
        self.name, self.start, self.out = "", 0, 0

    def _refused(self, what: str) -> ImageError:
        return ImageError(f"{self.path}: {self.name} {what} {self.max_ratio} times its compressed size: refused "
                          "(import.max_entry_ratio; memory that is almost all zeros compresses up to ~30000 times: "
                          "raise it for such a checkpoint from a node you trust)")

    def entry(self, name: str, size: int) -> None:
        self.name, self.start, self.out = name, self.consumed(), 0
        if self.total_bytes is not None and size > self.max_ratio * (self.total_bytes - self.start + self.read_bytes):
            raise self._refused(f"declares {size // (1 << 20)} MiB, which would expand more than")

    def moved(self, count: int) -> None:
        self.out += count
        if self.out > self.max_ratio * (self.consumed() - self.start + self.read_bytes):
            raise self._refused("expands more than")
