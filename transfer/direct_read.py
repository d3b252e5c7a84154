"""An archive read once, around the page cache.

An import reads GiBs of archive exactly once, just before a restore that needs that much
memory again. Through the page cache every byte also takes a cache page, which the restore
then has to wait to reclaim (and in a VM whose balloon hands freed memory back to the host,
every fresh page costs a fault there as well: on the CI VM, reading a 2 GB archive took 4.4 s
of system time buffered and 1.2 s with O_DIRECT). O_DIRECT reads into one aligned buffer
touch no new memory at all.
"""

from __future__ import annotations

import errno
import fcntl
import io
import mmap
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

BUFFER_BYTES = 8 << 20  # a multiple of every logical block size; large reads keep the disk busy
ALIGNMENT = 4096


class DirectReader(io.RawIOBase):
    """A regular file read sequentially with O_DIRECT where its filesystem allows it, with
    ordinary reads (and the cache dropped on close) where it does not."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._buffer = mmap.mmap(-1, BUFFER_BYTES)  # page-aligned, as O_DIRECT requires
        self._view: memoryview | None = memoryview(self._buffer)
        self.name, self.fd, self.direct = path, -1, False
        flags = os.O_RDONLY | os.O_CLOEXEC  # the operator names the archive: a link to it is fine
        try:
            self.fd, self.direct = os.open(path, flags | os.O_DIRECT), True
        except OSError as error:
            if error.errno != errno.EINVAL:  # tmpfs before Linux 6.6, some FUSE filesystems
                raise
            self.fd, self.direct = os.open(path, flags), False
        self._start = self._end = 0  # the buffered bytes not yet read: [_start, _end)
        self._offset = 0  # the file offset just past the buffered bytes

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def _fill(self) -> int:
        try:
            got = os.preadv(self.fd, [self._buffer], self._offset)
        except OSError as error:
            if error.errno != errno.EINVAL or not self.direct:
                raise
            # O_DIRECT accepted on open but refused on read: ordinary reads from here on
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            self.direct = False
            got = os.preadv(self.fd, [self._buffer], self._offset)
        self._start, self._end = 0, got
        self._offset += got
        return got

    def _take(self, size: int) -> memoryview:
        """Up to `size` of the next bytes, in the buffer (empty at the end of the file)."""
        view = self._view
        if view is None:
            raise ValueError("read of a closed DirectReader")
        if self._start == self._end and not self._fill():
            return view[:0]
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
        self._offset, self._start, self._end = aligned, 0, 0
        if offset > aligned:
            self._fill()
            self._start = min(offset - aligned, self._end)
        if self.tell() != offset:  # past the end: reads there return nothing
            self._offset, self._start, self._end = offset, 0, 0
        return offset

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self.fd >= 0 and not self.direct:
                try:
                    os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read once, never again
                except OSError:
                    pass  # not a regular file: nothing cached to drop
        finally:
            if self.fd >= 0:
                os.close(self.fd)
            if self._view is not None:
                self._view.release()
                self._view = None
                self._buffer.close()
            super().close()
