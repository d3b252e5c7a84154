"""A tar stream checked and re-emitted entry by entry at the speed of the pipe it comes from.

tarfile's stream mode copies every block through new bytes objects (a checkpoint is GiBs of
pages); here tarfile parses only the headers, and file data moves with readinto() through
one reused buffer, so the cost is the pipe's and the compressor's, not Python's.

Each entry's header blocks (with any PAX or GNU long-name blocks before it) are handed to
tarfile to parse, checked by `checked_name`, and written again in PAX format owned by root;
then exactly the declared size is copied, padded to the 512-byte block. Anything else —
links, devices, sparse files, a stream ending early, a bad header checksum — is an ImageError.
"""

from __future__ import annotations

import io
import tarfile

from gpuckpt.errors import ImageError

BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE
BUFFER_BYTES = 4 << 20
MAX_EXTENSION_BYTES = 1 << 20  # PAX records, long names: a few hundred bytes in practice
EXTENSION_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                   tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


class TruncatedStream(ImageError):
    pass


class _Reader:
    """Exact reads from a stream that supports readinto (a pipe, a decompressor, a file)."""

    def __init__(self, source, path: str) -> None:
        self.source, self.path = source, path
        self.buffer = bytearray(BUFFER_BYTES)
        self.view = memoryview(self.buffer)

    def fill(self, size: int) -> memoryview:
        """The next `size` bytes (at most BUFFER_BYTES) in the reused buffer."""
        got = 0
        while got < size:
            count = self.source.readinto(self.view[got:size])
            if not count:
                raise TruncatedStream(f"{self.path}: truncated or corrupt archive: the stream ends inside an entry")
            got += count
        return self.view[:size]

    def block(self) -> bytes:
        return bytes(self.fill(BLOCK))


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _parse(header_blocks: bytes, path: str) -> tarfile.TarInfo:
    """One member's header, extensions resolved, by tarfile itself."""
    try:
        with tarfile.open(fileobj=io.BytesIO(header_blocks + bytes(2 * BLOCK)), mode="r:") as tar:
            member = tar.next()
    except tarfile.TarError as error:
        raise ImageError(f"{path}: truncated or corrupt archive: {error}") from None
    if member is None:
        raise ImageError(f"{path}: truncated or corrupt archive: an empty header")
    return member


def entries(source, path: str):
    """Yield (member, reader) for each entry; the caller consumes exactly _padded(member.size) bytes."""
    from gpuckpt.oci.archive import checked_name

    reader = _Reader(source, path)
    pending = b""
    while True:
        try:
            block = reader.block()
        except TruncatedStream:
            raise TruncatedStream(f"{path}: truncated or corrupt archive: it ends before the "
                                  "end-of-archive blocks") from None
        if block == bytes(BLOCK):
            if pending:
                raise ImageError(f"{path}: truncated or corrupt archive: an extension header with no entry")
            return
        try:
            raw = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as error:
            raise ImageError(f"{path}: truncated or corrupt archive: {error}") from None
        if raw.type in EXTENSION_TYPES:
            if raw.size > MAX_EXTENSION_BYTES or len(pending) > MAX_EXTENSION_BYTES:
                raise ImageError(f"{path}: an extension header of {raw.size} bytes: refused")
            pending += block + bytes(reader.fill(_padded(raw.size)))
            continue
        member = _parse(pending + block, path)
        pending = b""
        try:
            member.name = checked_name(member)
        except ImageError as error:
            raise ImageError(f"{path}: {error}") from None
        if member.type == tarfile.GNUTYPE_SPARSE or member.sparse is not None:
            raise ImageError(f"{path}: archive entry {member.name!r} is a sparse file: refused")
        yield member, reader


def copy_data(reader: _Reader, size: int, out, moved=None, pad: bool = True) -> int:
    """Move `size` bytes of entry data and its padding from reader to out (None: drop them;
    pad=False: the data alone, for a plain file); `moved(n)` hears of each chunk. Returns the
    bytes read."""
    left = total = _padded(size)
    while left:
        chunk = reader.fill(min(left, BUFFER_BYTES))
        data_part = max(0, min(len(chunk), size))
        if out is not None:
            out.write(chunk[:data_part])
            if len(chunk) > data_part and pad:
                out.write(bytes(len(chunk) - data_part))  # padding written anew, as zeros
        left -= len(chunk)
        size -= len(chunk)
        if moved and data_part:
            moved(data_part)
    return total


def write_header(member: tarfile.TarInfo, out) -> int:
    """The member's header, in PAX format and owned by root; returns its length."""
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    header = member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    out.write(header)
    return len(header)


def write_end(out, written: int) -> None:
    """Two zero blocks, then zeros to the end of the 10 KiB record, as tar writes it."""
    end = written + 2 * BLOCK
    out.write(bytes(2 * BLOCK + (-end) % RECORD))
