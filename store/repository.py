"""The store on disk: a root-only directory of chunk files and checkpoint manifests, and its lock.

    ROOT/                   0700, root's (host.safefiles.private_directory), /var/lib/gpuckpt/store
      store.lock            flock: shared while a checkpoint is written or read, exclusive to collect
      chunks/ab/abcd…       one chunk, a zstd frame, named by the BLAKE3 digest of its bytes (64 hex);
                            DIGEST.PID.TID.partial beside it while it is written
      checkpoints/NAME.json a checkpoint (store.manifest), linked into place once complete
      tmp/                  manifests being written

A chunk is written once: under a temporary name, renamed into place, compressed unless a sample of it
does not compress (then zstd's raw blocks around the bytes themselves); all of a checkpoint's chunks
are on disk (sync) before its manifest is written.
Everything read back is bounded and checked: names are hex digests or checkpoint names only, files
are regular and read without following links, a chunk must decompress to exactly its size and
digest. Only this module opens files in the store.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

import zstandard

from ..errors import ImageError, NotFoundError, UsageError
from ..host.safefiles import make_directory_at, private_directory, read_regular
from .chunking import DIGEST, MAX_CHUNK_BYTES, chunk_digest
from .manifest import MAX_MANIFEST_BYTES, NAME, StoredCheckpoint, check_name, parse_stored

DEFAULT_STORE_DIR = "/var/lib/gpuckpt/store"
CHUNKS, CHECKPOINTS, TEMPORARY, LOCK = "chunks", "checkpoints", "tmp", "store.lock"
MANIFEST_SUFFIX = ".json"
# zstd's bound for a chunk that does not compress (ZSTD_compressBound), and room for the frame
MAX_STORED_CHUNK_BYTES = MAX_CHUNK_BYTES + (MAX_CHUNK_BYTES >> 7) + 4096
COMPRESSION_LEVEL = 1  # speed first: pages are large and mostly incompressible or zero
SAMPLE_BYTES = 16 << 10  # what is compressed to guess whether a chunk compresses
RAW_ABOVE = 0.97  # a sample compressed to more than this share of itself: the chunk is stored raw
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
RAW_BLOCK_BYTES = 128 << 10  # zstd's largest block
PARTIAL_SUFFIX = ".partial"  # a chunk being written, beside its final name
PARTIAL = re.compile(r"[0-9a-f]{64}\.[0-9]+\.[0-9]+\.partial")
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ChunkError(ImageError):
    """A chunk is missing, unreadable or not what its name says; the message names it."""

    def __init__(self, message: str, digest: str) -> None:
        super().__init__(message)
        self.digest = digest


class StoreBusy(UsageError):
    """The lock is held the other way (a checkpoint is being written, or chunks collected)."""


def _fanout(digest: str) -> str:
    return digest[:2]


def raw_frame(data: memoryview) -> list[memoryview | bytes]:
    """`data` as one zstd frame of raw blocks (RFC 8878: a single-segment frame with its 8-byte content
    size, no checksum: the chunk's digest is checked), as the pieces to write: headers and views of `data`."""
    # frame header descriptor 0xE0: content size in 8 bytes, single segment (no window descriptor)
    pieces: list[memoryview | bytes] = [ZSTD_MAGIC + b"\xe0" + len(data).to_bytes(8, "little")]
    for start in range(0, len(data), RAW_BLOCK_BYTES):
        block = data[start:start + RAW_BLOCK_BYTES]
        last = start + RAW_BLOCK_BYTES >= len(data)
        pieces += [(int(last) | len(block) << 3).to_bytes(3, "little"), block]  # block type 0: raw
    return pieces


def _advanced(pieces: list[memoryview | bytes], count: int) -> list[memoryview | bytes]:
    """What is left to write of `pieces` after a writev wrote `count` bytes."""
    while pieces and count >= len(pieces[0]):
        count -= len(pieces[0])
        pieces = pieces[1:]
    if pieces and count:
        pieces = [memoryview(pieces[0])[count:], *pieces[1:]]
    return pieces


class Store:
    """One store, opened (made 0700 if missing, checked private) for the life of a command."""

    def __init__(self, root: str = DEFAULT_STORE_DIR) -> None:
        self.root = os.path.abspath(root)
        self.fd = private_directory(self.root)
        self._local = threading.local()
        try:
            for name in (CHUNKS, CHECKPOINTS, TEMPORARY):
                os.close(make_directory_at(self.fd, name)[0])  # ELOOP, not followed, if a link is there
            chunks = os.open(CHUNKS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
            try:
                for fanout in range(256):  # made once, not looked for at every chunk
                    os.close(make_directory_at(chunks, f"{fanout:02x}")[0])
            finally:
                os.close(chunks)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    # --- the lock -------------------------------------------------------------------------------
    @contextmanager
    def locked(self, exclusive: bool = False, wait_s: float | None = None) -> Iterator[None]:
        """Shared: checkpoints written and read (many at once); exclusive: a collection (no chunk
        is added or read meanwhile). `wait_s` None waits as long as it takes; else StoreBusy."""
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        try:
            kind = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            deadline = None if wait_s is None else time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, kind | (fcntl.LOCK_NB if deadline is not None else 0))
                    break
                except BlockingIOError:
                    if deadline is None or time.monotonic() >= deadline:
                        holder = "a checkpoint is being written or read" if exclusive else "chunks are being collected"
                        raise StoreBusy(f"{self.root}: the store is busy ({holder}): try again later") from None
                    time.sleep(0.1)
            yield
        finally:
            os.close(fd)

    # --- chunks ---------------------------------------------------------------------------------
    @staticmethod
    def chunk_name(digest: str) -> str:
        if not DIGEST.fullmatch(digest):
            raise ImageError(f"chunk {digest[:80]!r} is not a BLAKE3 digest (64 hex digits): refused")
        return f"{CHUNKS}/{_fanout(digest)}/{digest}"

    def has_chunk(self, digest: str) -> bool:
        try:
            status = os.stat(self.chunk_name(digest), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(status.st_mode)

    def _compressor(self) -> zstandard.ZstdCompressor:
        compressor: zstandard.ZstdCompressor | None = getattr(self._local, "compressor", None)
        if compressor is None:  # one per thread: python-zstandard's objects are not shared between threads
            compressor = self._local.compressor = zstandard.ZstdCompressor(level=COMPRESSION_LEVEL)
        return compressor

    def put_chunk(self, digest: str, data: memoryview | bytes) -> int:
        """Write one chunk (a zstd frame, renamed into place; `sync` puts it on disk); its bytes on disk."""
        name = self.chunk_name(digest)
        frame = self._frame(memoryview(data))
        # beside its final name: one directory of 256 per rename, not one for every writer thread
        temporary = f"{CHUNKS}/{_fanout(digest)}/{digest}.{os.getpid()}.{threading.get_ident()}{PARTIAL_SUFFIX}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.fd)
        try:
            written = 0
            while frame:
                count = os.writev(fd, frame)
                written += count
                frame = _advanced(frame, count)
        except BaseException:
            os.close(fd)
            os.unlink(temporary, dir_fd=self.fd)
            raise
        os.close(fd)
        os.rename(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        return written

    def _frame(self, data: memoryview) -> list[memoryview | bytes]:
        """The chunk as one zstd frame: compressed, or, when a sample of it does not compress (random
        pages, encrypted or compressed data), zstd's raw blocks around the data itself, which costs
        no copy and no compression (zstd level 1 spends ~0.8 s per GiB of random data to find that out)."""
        middle = max(0, len(data) // 2 - SAMPLE_BYTES // 2)
        sample = data[middle:middle + SAMPLE_BYTES]
        if len(self._compressor().compress(sample)) < RAW_ABOVE * len(sample):
            return [self._compressor().compress(data)]
        return raw_frame(data)

    @staticmethod
    def sync() -> None:
        """Every chunk written so far on disk, before a manifest names them. sync(2): Python has no
        syncfs, and a fdatasync per chunk is a journal commit per chunk (3,300 per GiB; measured on the CI
        VM: 17.5 s of waiting threads per GiB, the whole checkpoint's time twice over); one sync is one
        commit, and the data it flushes beyond the store's is what the node would write back anyway."""
        os.sync()

    def read_chunk(self, digest: str, size: int) -> bytes:
        """A chunk's bytes, checked: exactly `size` of them, and their digest its name; else a ChunkError."""
        name = self.chunk_name(digest)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            raise ChunkError(f"chunk {digest} is missing from {self.root}", digest) from None
        except OSError as error:
            raise ChunkError(f"chunk {digest} cannot be read: {error.strerror}", digest) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ChunkError(f"chunk {digest} is not a regular file: refused", digest)
            stored = os.read(fd, MAX_STORED_CHUNK_BYTES + 1)
        finally:
            os.close(fd)
        if len(stored) > MAX_STORED_CHUNK_BYTES:
            raise ChunkError(f"chunk {digest} is corrupt: larger than any chunk is stored", digest)
        try:
            # a frame declaring another size is refused before anything is allocated for it
            declared = zstandard.get_frame_parameters(stored).content_size
            if declared != size:
                raise ChunkError(f"chunk {digest} is corrupt: it declares {declared} bytes, not {size}", digest)
            data = zstandard.ZstdDecompressor().decompress(stored, max_output_size=size)
        except zstandard.ZstdError as error:
            raise ChunkError(f"chunk {digest} is corrupt: {error}", digest) from None
        if len(data) != size or chunk_digest(data) != digest:
            raise ChunkError(f"chunk {digest} is corrupt: its bytes do not hash to its name", digest)
        return data

    def chunk_files(self) -> Iterator[tuple[str, os.stat_result]]:
        """Every chunk file in the store (names that are not digests are left alone), with its status."""
        for fanout in self._list(CHUNKS):
            if len(fanout) != 2 or not all(c in "0123456789abcdef" for c in fanout):
                continue
            directory = f"{CHUNKS}/{fanout}"
            for name in self._list(directory):
                if DIGEST.fullmatch(name) and name.startswith(fanout):
                    try:
                        yield name, os.stat(f"{directory}/{name}", dir_fd=self.fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue

    def remove_chunk(self, digest: str) -> None:
        os.unlink(self.chunk_name(digest), dir_fd=self.fd)

    def temporary_files(self) -> Iterator[tuple[str, os.stat_result]]:
        """What writers left: manifests in tmp/, partial chunks beside the chunks (as paths in the store)."""
        found = [f"{TEMPORARY}/{name}" for name in self._list(TEMPORARY) if name not in (".", "..")]
        for fanout in self._list(CHUNKS):
            if len(fanout) == 2 and all(c in "0123456789abcdef" for c in fanout):
                found += [f"{CHUNKS}/{fanout}/{name}" for name in self._list(f"{CHUNKS}/{fanout}")
                          if PARTIAL.fullmatch(name)]
        for relative in found:
            try:
                yield relative, os.stat(relative, dir_fd=self.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue

    def remove_temporary(self, relative: str) -> None:
        directory, _, name = relative.rpartition("/")
        if not (directory == TEMPORARY or (directory.startswith(f"{CHUNKS}/") and PARTIAL.fullmatch(name))) \
                or name in ("", ".", ".."):
            raise ImageError(f"{relative!r} is not a temporary file of the store")
        os.unlink(relative, dir_fd=self.fd)

    def _list(self, relative: str) -> list[str]:
        """The names in a directory of the store, opened without following a link."""
        fd = os.open(relative, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    # --- checkpoints ----------------------------------------------------------------------------
    def checkpoint_names(self) -> list[str]:
        names = []
        for file_name in self._list(CHECKPOINTS):
            name = file_name.removesuffix(MANIFEST_SUFFIX)
            if file_name.endswith(MANIFEST_SUFFIX) and NAME.fullmatch(name):
                names.append(name)
        return sorted(names)

    def has_checkpoint(self, name: str) -> bool:
        return os.path.lexists(os.path.join(self.root, CHECKPOINTS, f"{check_name(name)}{MANIFEST_SUFFIX}"))

    def read_checkpoint(self, name: str) -> StoredCheckpoint:
        relative = f"{CHECKPOINTS}/{check_name(name)}{MANIFEST_SUFFIX}"
        what = os.path.join(self.root, relative)
        try:
            fd = os.open(relative, _READ_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            raise NotFoundError(f"no checkpoint {name!r} in {self.root} (gpuckpt store list shows them)") from None
        except OSError as error:
            raise ImageError(f"{what}: cannot read: {error.strerror}") from None
        stored = parse_stored(read_regular(fd, MAX_MANIFEST_BYTES, what), what)
        if stored.name != name:
            raise ImageError(f"{what}: names itself {stored.name!r}: refused")
        return stored

    def write_checkpoint(self, stored: StoredCheckpoint) -> str:
        """The manifest, synced, then linked into place (never over another); its path."""
        final = f"{CHECKPOINTS}/{check_name(stored.name)}{MANIFEST_SUFFIX}"
        temporary = f"{TEMPORARY}/{stored.name}{MANIFEST_SUFFIX}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(stored.model_dump_json().encode())
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(temporary, final, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            except FileExistsError:
                raise UsageError(f"a checkpoint named {stored.name!r} is already in {self.root}: "
                                 "give another --name") from None
        finally:
            os.unlink(temporary, dir_fd=self.fd)
        directory = os.open(CHECKPOINTS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return os.path.join(self.root, final)

    def remove_checkpoint(self, name: str) -> None:
        try:
            os.unlink(f"{CHECKPOINTS}/{check_name(name)}{MANIFEST_SUFFIX}", dir_fd=self.fd)
        except FileNotFoundError:
            raise UsageError(f"no checkpoint {name!r} in {self.root} (gpuckpt store list shows them)") from None

