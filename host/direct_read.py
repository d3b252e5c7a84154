"""An archive read once, around the page cache.

An import reads GiBs of archive exactly once, just before a restore that needs that much
memory again. Through the page cache every byte also takes a cache page, which the restore
then has to wait to reclaim (and in a VM whose balloon hands freed memory back to the host,
every fresh page costs a fault there as well: on the CI VM, reading a 2 GB archive took 4.4 s
of system time buffered and 1.2 s with O_DIRECT). O_DIRECT reads into one aligned buffer
touch no new memory at all. The next buffer is read on a thread of its own while the caller
decompresses and hashes the last one (preadv lets go of the GIL): the disk and the CPU work overlap.
"""

from __future__ import annotations

import errno
import fcntl
import io
import mmap
import os
import stat
from contextlib import suppress
from typing import TYPE_CHECKING

from .background import OnThread

if TYPE_CHECKING:
    from typing_extensions import Buffer

BUFFER_BYTES = 8 << 20  # a multiple of every logical block size; large reads keep the disk busy
ALIGNMENT = 4096


class NotAnArchiveFile(OSError):
    """A path that names a directory, FIFO, device or socket: an archive is read from a regular file."""

    def __init__(self, path: str, mode: int) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({file_kind(mode)}): give the archive file itself")
        self.filename = path


def file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a file")


class DirectReader(io.RawIOBase):
    """A regular file read sequentially with O_DIRECT where its filesystem allows it, with
    ordinary reads (and the cache dropped on close) where it does not."""

    def __init__(self, path: str) -> None:
        super().__init__()
        # two page-aligned buffers, as O_DIRECT requires: one read from, one being filled ahead
        self._buffers = [mmap.mmap(-1, BUFFER_BYTES), mmap.mmap(-1, BUFFER_BYTES)]
        self._views: list[memoryview] | None = [memoryview(buffer) for buffer in self._buffers]
        self._current = 0
        self._ahead: OnThread[int] | None = None  # the other buffer's read of the bytes at _offset
        self.name, self.fd, self.direct = path, -1, False
        # The operator names the archive: a link to it is fine. What it names is looked at (O_PATH) before it is
        # opened: opening a FIFO with no writer hangs, opening a device may act (a watchdog's starts).
        located = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            mode = os.fstat(located).st_mode
            if not stat.S_ISREG(mode):
                raise NotAnArchiveFile(path, mode)
            same_file = f"/proc/self/fd/{located}"  # the file looked at, whatever the path names by now
            flags = os.O_RDONLY | os.O_CLOEXEC
            try:
                self.fd, self.direct = os.open(same_file, flags | os.O_DIRECT), True
            except OSError as error:
                if error.errno != errno.EINVAL:  # tmpfs before Linux 6.6, some FUSE filesystems
                    raise
                self.fd, self.direct = os.open(same_file, flags), False
        finally:
            os.close(located)
        self._start = self._end = 0  # the buffered bytes not yet read: [_start, _end)
        self._offset = 0  # the file offset just past the buffered bytes

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def _read_at(self, index: int, offset: int) -> int:
        try:
            return os.preadv(self.fd, [self._buffers[index]], offset)
        except OSError as error:
            if error.errno != errno.EINVAL or not self.direct:
                raise
            # O_DIRECT accepted on open but refused on read: ordinary reads from here on
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            self.direct = False
            return os.preadv(self.fd, [self._buffers[index]], offset)

    def _fill(self) -> int:
        if self._ahead is not None:
            got, self._ahead = self._ahead.result(), None
            self._current ^= 1
        else:
            got = self._read_at(self._current, self._offset)
        self._start, self._end = 0, got
        self._offset += got
        if got == BUFFER_BYTES:  # more may follow: read it into the other buffer meanwhile
            index, offset = self._current ^ 1, self._offset
            self._ahead = OnThread(lambda: self._read_at(index, offset), "gpuckpt-read-ahead")
        return got

    def _drop_ahead(self) -> None:
        """Wait for a read ahead and forget it (a seek went elsewhere, or the reader closes)."""
        if self._ahead is not None:
            with suppress(OSError):  # bytes nobody will read
                self._ahead.result()
            self._ahead = None

    def _take(self, size: int) -> memoryview:
        """Up to `size` of the next bytes, in the buffer (empty at the end of the file)."""
        if self._views is None:
            raise ValueError("read of a closed DirectReader")
        if self._start == self._end and not self._fill():
            return self._views[self._current][:0]
        view = self._views[self._current]  # after a fill: it may have moved to the buffer read ahead
        taken = view[self._start:self._start + min(size, self._end - self._start)]
        self._start += len(taken)
        return taken

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(BUFFER_BYTES), b""))
        return bytes(self._take(size))

    def readinto(self, target: Buffer) -> int:
        view = memoryview(target)
        taken = self._take(len(view))
        view[:len(taken)] = taken
        return len(taken)

    def tell(self) -> int:
        return self._offset - (self._end - self._start)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset += self.tell()
        elif whence == os.SEEK_END:
            offset += os.fstat(self.fd).st_size
        if offset < 0:
            raise OSError(errno.EINVAL, f"{self.name}: a seek before the start")
        aligned = offset - offset % ALIGNMENT
        self._drop_ahead()
        self._offset, self._start, self._end = aligned, 0, 0
        if offset > aligned:
            self._fill()
            self._start = min(offset - aligned, self._end)
        if self.tell() != offset:  # past the end: reads there return nothing
            self._drop_ahead()
            self._offset, self._start, self._end = offset, 0, 0
        return offset

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self.fd >= 0 and not self.direct:
                with suppress(OSError):  # not a regular file: nothing cached to drop
                    os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read once, never again
        finally:
            self._drop_ahead()
            if self.fd >= 0:
                os.close(self.fd)
            if self._views is not None:
                for view, buffer in zip(self._views, self._buffers, strict=True):
                    view.release()
                    buffer.close()
                self._views = None
            super().close()

