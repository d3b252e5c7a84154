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
import posixpath
import tarfile
from collections.abc import Callable, Iterator
from typing import Protocol

from ..errors import ImageError

BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE
BUFFER_BYTES = 4 << 20
MAX_TRAILING_ZEROS = 16 << 20  # after the end blocks: tar pads to its record (10 KiB; `-b 32768`, 16 MiB)
MAX_EXTENSION_BYTES = 1 << 20  # PAX records, long names: a few hundred bytes in practice
MAX_EXTENSIONS = 8  # extension headers before one entry (tarfile recurses on each)
# A checkpoint holds about ten files per process (CRIU's images), so this is 5,000 processes.
# Each entry's header is a staged 512-byte block or more on import, taken from the staging budget.
MAX_ENTRIES = 50_000
# A sanity bound of the format (one process's pages on a large node); what an import may write
# is the operator's staging budget (transfer.bounds), checked against each entry's size.
MAX_MEMBER_BYTES = 1 << 40
# PAX keys that describe the entry itself; anything else (GNU.sparse.*, vendor keys) is refused,
# so no reader can see a size, name or sparse map other than the one checked here.
PAX_KEYS = frozenset({"path", "linkpath", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname",
                      "comment", "charset", "hdrcharset"})
PAX_KEY_PREFIXES = ("SCHILY.xattr.", "LIBARCHIVE.xattr.")
EXTENSION_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                   tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


def checked_name(member: tarfile.TarInfo) -> str:
    """The entry's normalized name, if it stays inside the target and is a plain file or directory."""
    name = member.name
    normalized = posixpath.normpath(name)
    if name.startswith("/") or normalized.startswith("..") or "/../" in f"/{name}/" or normalized == ".":
        raise ImageError(f"archive entry {name!r} escapes the target directory")
    if "\0" in name:
        raise ImageError(f"archive entry {name!r} has a NUL byte in its name")
    if member.issym() or member.islnk():
        raise ImageError(f"archive entry {name!r} is a link ({member.linkname!r}): only files and directories are "
                         "accepted")
    if not (member.isfile() or member.isdir()):
        raise ImageError(f"archive entry {name!r} is a device, FIFO or other special file: refused")
    if member.size < 0 or member.size > MAX_MEMBER_BYTES:
        raise ImageError(f"archive entry {name!r} declares {member.size} bytes: refused")
    return normalized


# What entry data is handed on as: a view into the reused read buffer, or bytes made here.
Data = bytes | bytearray | memoryview


class ByteSource(Protocol):
    """A stream read with readinto (a pipe, a decompressor, a file)."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...


class ByteSink(Protocol):
    """Where data is written (a file, a compressor, a digest): write is all that is used."""

    def write(self, data: Data, /) -> object: ...


class TruncatedStream(ImageError):
    pass


class EntryReader:
    """Exact reads from a stream that supports readinto (a pipe, a decompressor, a file)."""

    def __init__(self, source: ByteSource, path: str) -> None:
        self.source, self.path = source, path
        self.buffer = bytearray(BUFFER_BYTES)
        self.view = memoryview(self.buffer)

    def fill(self, size: int) -> memoryview:
        """The next `size` bytes (at most BUFFER_BYTES) in the reused buffer."""
        if not 0 <= size <= BUFFER_BYTES:
            raise ImageError(f"{self.path}: truncated or corrupt archive: a read of {size} bytes")
        got = 0
        while got < size:
            count = self.source.readinto(self.view[got:size])
            if not count:
                raise TruncatedStream(f"{self.path}: truncated or corrupt archive: the stream ends inside an entry")
            got += count
        return self.view[:size]

    def block(self) -> bytes:
        return bytes(self.fill(BLOCK))


def padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def parse_header(header_blocks: bytes, path: str) -> tarfile.TarInfo:
    """One member's header, extensions resolved, by tarfile itself; PAX records beyond PAX_KEYS
    and xattrs refused."""
    try:
        with tarfile.open(fileobj=io.BytesIO(header_blocks + bytes(2 * BLOCK)), mode="r:") as tar:
            member = tar.next()
    except (tarfile.TarError, ValueError, RecursionError, UnicodeError, OverflowError) as error:
        raise ImageError(f"{path}: truncated or corrupt archive: a bad header: {error}") from None
    if member is None:
        raise ImageError(f"{path}: truncated or corrupt archive: an empty header")
    if member.size < 0 or member.size > MAX_MEMBER_BYTES:  # a PAX size record may say anything
        raise ImageError(f"{path}: archive entry {member.name[:200]!r} declares {member.size} bytes: refused")
    unknown = [key for key in member.pax_headers if key not in PAX_KEYS and not key.startswith(PAX_KEY_PREFIXES)]
    if unknown:
        raise ImageError(f"{path}: archive entry {member.name!r} has PAX records {sorted(unknown)[:3]}: refused "
                         f"(allowed: {', '.join(sorted(PAX_KEYS))}, xattrs)")
    return member


def entries(source: ByteSource, path: str, *, links: bool = False,
            max_entries: int = MAX_ENTRIES) -> Iterator[tuple[tarfile.TarInfo, EntryReader]]:
    """Yield (member, reader) for each entry; the caller consumes exactly padded(member.size) bytes
    of a regular file's and none of any other entry's. With `links`, names, links and special files
    are the caller's to check (oci.nested_tar's rules), sparse files still refused."""
    reader = EntryReader(source, path)
    pending, extensions, count = b"", 0, 0
    kinds: list[bytes] = []
    while True:
        try:
            block = reader.block()
        except TruncatedStream:
            raise TruncatedStream(f"{path}: truncated or corrupt archive: it ends before the "
                                  "end-of-archive blocks") from None
        if block == bytes(BLOCK):
            if pending:
                raise ImageError(f"{path}: truncated or corrupt archive: an extension header with no entry")
            _end(reader, path)
            return
        raw = raw_header(block, path)
        if links:
            refuse_old_header(block, path)
        if raw.type in EXTENSION_TYPES:
            kinds.append(raw.type)
            if links:
                refuse_ambiguous_extensions(kinds, path)
            extensions += 1
            if raw.size > MAX_EXTENSION_BYTES or len(pending) > MAX_EXTENSION_BYTES or extensions > MAX_EXTENSIONS:
                raise ImageError(f"{path}: extension headers of {len(pending) + raw.size} bytes "
                                 f"({extensions}) before one entry: refused")
            pending += block + bytes(reader.fill(padded(raw.size)))
            continue
        count += 1
        if count > max_entries:
            raise ImageError(f"{path}: more than {max_entries} entries: refused")
        member = _member(pending + block, path, links)
        pending, extensions, kinds = b"", 0, []
        yield member, reader


def refuse_old_header(block: bytes, path: str) -> None:
    """A header without ustar's magic (a V7 header): tarfile reads its prefix field, Go's archive/tar does
    not, so the two see different names; Go and GNU tar write the magic. Refused."""
    if block[257:263] not in (b"ustar\0", b"ustar "):
        raise ImageError(f"{path}: a tar header without ustar's magic (V7): refused (readers disagree on its name)")


def refuse_ambiguous_extensions(kinds: list[bytes], path: str) -> None:
    """The extension headers before one entry of a tar that another reader will unpack: a global header
    (tarfile folds it into the next entry, Go's archive/tar returns it as an entry of its own) or a PAX
    record with a GNU long name (each reader lets a different one win) name two things: refused."""
    if tarfile.XGLTYPE in kinds or tarfile.SOLARIS_XHDTYPE in kinds:
        raise ImageError(f"{path}: a PAX global header: refused (readers disagree on what it names)")
    if tarfile.XHDTYPE in kinds and (tarfile.GNUTYPE_LONGNAME in kinds or tarfile.GNUTYPE_LONGLINK in kinds):
        raise ImageError(f"{path}: an entry named by both a PAX record and a GNU long name: refused (readers "
                         "disagree on which wins)")
    if len(kinds) != len(set(kinds)):
        raise ImageError(f"{path}: an entry with two extension headers of one kind: refused")


def raw_header(block: bytes, path: str) -> tarfile.TarInfo:
    """One header block as it stands (an extension header's own, or an entry's before its extensions)."""
    try:
        raw = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except (tarfile.HeaderError, ValueError, UnicodeError, OverflowError) as error:
        raise ImageError(f"{path}: truncated or corrupt archive: {error}") from None
    if raw.size < 0:
        raise ImageError(f"{path}: truncated or corrupt archive: an entry declares {raw.size} bytes")
    return raw


def _member(header_blocks: bytes, path: str, links: bool = False) -> tarfile.TarInfo:
    """An entry's header with its extensions, its name checked (unless `links`); sparse files refused."""
    member = parse_header(header_blocks, path)
    try:
        if not links:
            member.name = checked_name(member)
    except ImageError as error:
        raise ImageError(f"{path}: {error}") from None
    if member.type == tarfile.GNUTYPE_SPARSE or member.sparse is not None:
        raise ImageError(f"{path}: archive entry {member.name!r} is a sparse file: refused")
    return member


def _end(reader: EntryReader, path: str) -> None:
    """After the first zero block: the second, then zeros to the end of the stream (tar pads to
    its record); reading to the end also lets a writer on a pipe finish without EPIPE."""
    try:
        if reader.block() != bytes(BLOCK):
            raise ImageError(f"{path}: truncated or corrupt archive: data after an end-of-archive block")
    except TruncatedStream:
        raise TruncatedStream(f"{path}: truncated or corrupt archive: it ends inside the end-of-archive "
                              "blocks") from None
    trailing = 0
    while count := reader.source.readinto(reader.view):
        if any(reader.view[:count]):
            raise ImageError(f"{path}: truncated or corrupt archive: data after the end-of-archive blocks")
        trailing += count
        if trailing > MAX_TRAILING_ZEROS:  # a compressed stream of zeros would never end (or take hours)
            raise ImageError(f"{path}: corrupt archive: more than {MAX_TRAILING_ZEROS >> 20} MiB of zeros after "
                             "the end-of-archive blocks (tar pads to its record size only)")


def copy_data(reader: EntryReader, size: int, out: ByteSink | None, moved: Callable[[int], None] | None = None, *,
              pad: bool = True, watch: ByteSink | None = None) -> int:
    """Move `size` bytes of entry data and its padding from reader to out (None: drop them;
    pad=False: the data alone, for a plain file); `moved(n)` hears of each chunk, `watch.write`
    sees the data too (never the padding: a digest, say). Returns the bytes read."""
    left = total = padded(size)
    while left:
        chunk = reader.fill(min(left, BUFFER_BYTES))
        data_part = max(0, min(len(chunk), size))
        if watch is not None and data_part:
            watch.write(chunk[:data_part])
        if out is not None:
            out.write(chunk[:data_part])
            if len(chunk) > data_part and pad:
                out.write(bytes(len(chunk) - data_part))  # padding written anew, as zeros
        left -= len(chunk)
        size -= len(chunk)
        if moved and data_part:
            moved(data_part)
    return total


def write_header(member: tarfile.TarInfo, out: ByteSink) -> int:
    """A fresh header for the checked entry: its name, type and size, its permission bits (no
    setuid, setgid or sticky), its whole-second mtime, owned by root, and nothing else of the
    input's (no PAX record, no xattr) passes through. Returns its length."""
    fresh = tarfile.TarInfo(member.name)
    fresh.type = tarfile.DIRTYPE if member.isdir() else tarfile.REGTYPE
    fresh.size = 0 if member.isdir() else member.size
    fresh.mode = member.mode & 0o777
    fresh.mtime = int(member.mtime) if 0 <= member.mtime < 2**33 else 0
    fresh.uid = fresh.gid = 0
    fresh.uname = fresh.gname = "root"
    try:
        header = fresh.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")
    except (ValueError, UnicodeError) as error:
        raise ImageError(f"archive entry {member.name!r} cannot be written again: {error}") from None
    out.write(header)
    return len(header)


def write_end(out: ByteSink, written: int) -> None:
    """Two zero blocks, then zeros to the end of the 10 KiB record, as tar writes it."""
    end = written + 2 * BLOCK
    out.write(bytes(2 * BLOCK + (-end) % RECORD))
