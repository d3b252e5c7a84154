"""The archive reader that goes around the page cache returns exactly the file's bytes, in any
read sizes and after seeks, and the zstd stream check refuses streams cut inside a frame."""

from __future__ import annotations

import os
import time

import pytest
import zstandard

from gpuckpt.cli import transfer
from gpuckpt.errors import ImageError
from gpuckpt.host.direct_read import BUFFER_BYTES, DirectReader
from gpuckpt.oci.archive import decompressed, open_archive


@pytest.fixture
def data_file(tmp_path):
    data = os.urandom(BUFFER_BYTES + 12345) + bytes(70000)
    path = tmp_path / "data"
    path.write_bytes(data)
    return str(path), data


@pytest.mark.parametrize("size", [1, 4095, 4096, 1 << 20, BUFFER_BYTES + 1])
def test_reads_return_the_file_exactly(data_file, size) -> None:
    path, data = data_file
    with DirectReader(path) as reader:
        got = b"".join(iter(lambda: reader.read(size), b""))
        assert reader.tell() == len(data)
    assert got == data


def test_seeks_land_on_the_right_byte(data_file) -> None:
    path, data = data_file
    with DirectReader(path) as reader:
        assert reader.read(4) == data[:4]
        for offset in (0, 1, 4097, BUFFER_BYTES - 1, BUFFER_BYTES + 5, len(data) - 3):
            assert reader.seek(offset) == offset and reader.tell() == offset
            assert reader.read(10) == data[offset:offset + 10]
        reader.seek(0)
        assert reader.read() == data
        assert reader.seek(-3, os.SEEK_END) == len(data) - 3 and reader.read() == data[-3:]


def test_a_seek_past_the_end_reads_nothing_and_tells_where_it_is(data_file) -> None:
    path, data = data_file
    with DirectReader(path) as reader:
        for offset in (len(data) + 1, len(data) + 5000, len(data) + BUFFER_BYTES):
            assert reader.seek(offset) == offset and reader.tell() == offset
            assert reader.read(10) == b""
        assert reader.seek(-2, os.SEEK_CUR) == offset - 2


def test_a_missing_file_is_an_os_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        DirectReader(str(tmp_path / "absent"))


def test_a_filesystem_without_direct_io_is_read_plainly(data_file, monkeypatch) -> None:
    path, data = data_file
    real_open = os.open

    def refuse_direct(name, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")
        return real_open(name, flags, *args)

    monkeypatch.setattr(os, "open", refuse_direct)
    with DirectReader(path) as reader:
        assert not reader.direct
        assert reader.read() == data


def _zstd(payload: bytes, **options) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=True, **options).compress(payload)


def _read_all(tmp_path, stream: bytes) -> bytes:
    path = tmp_path / "a.zst"
    path.write_bytes(stream)
    with open_archive(str(path)) as raw:
        return decompressed(raw).read()


def test_frames_and_skippable_frames_pass(tmp_path) -> None:
    first, second = os.urandom(300000), bytes(1 << 20)
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"12345"
    assert _read_all(tmp_path, _zstd(first) + skippable + _zstd(second)) == first + second


@pytest.mark.parametrize("cut", [1, 3, 4, 100])
def test_a_stream_cut_inside_its_last_frame_is_refused(tmp_path, cut) -> None:
    # cut 1..4: only the content checksum is missing, which the decompressor alone lets pass
    stream = _zstd(os.urandom(200000))
    with pytest.raises(ImageError, match="ends inside a frame"):
        _read_all(tmp_path, stream[:-cut])


def test_bytes_after_the_last_frame_are_refused(tmp_path) -> None:
    with pytest.raises(ImageError, match="after the last zstd frame"):
        _read_all(tmp_path, _zstd(b"payload") + b"garbage!")


def test_readinto_fills_from_the_same_stream(data_file) -> None:
    path, data = data_file
    target = bytearray(5000)
    with DirectReader(path) as reader:
        assert reader.read(3) == data[:3]
        got = reader.readinto(target)
        assert bytes(target[:got]) == data[3:3 + got] and got > 0
        assert reader.tell() == 3 + got


def test_reads_across_buffers_read_ahead_and_seeks_back_return_the_file_exactly(tmp_path) -> None:
    """The next buffer is read on a thread while the last is consumed: every byte still comes once, in order,
    and a seek while a read ahead is in flight lands on the right byte."""
    data = os.urandom(3 * BUFFER_BYTES + 777)
    path = tmp_path / "big"
    path.write_bytes(data)
    with DirectReader(str(path)) as reader:
        target = bytearray(1 << 20)
        got = bytearray()
        while count := reader.readinto(target):
            got += target[:count]
        assert bytes(got) == data
        reader.seek(BUFFER_BYTES - 5)  # a read ahead of the second buffer starts here
        assert reader.read(10) == data[BUFFER_BYTES - 5:BUFFER_BYTES + 5]
        reader.seek(7)
        again = bytearray()
        while len(again) < 2 * BUFFER_BYTES:  # a raw read may return less than asked
            again += reader.read(2 * BUFFER_BYTES - len(again))
        assert bytes(again) == data[7:7 + 2 * BUFFER_BYTES]



@pytest.mark.hostile("a directory or a FIFO named as the archive (a FIFO nobody writes)")
def test_a_fifo_or_directory_is_refused_at_once_in_one_line(tmp_path) -> None:
    fifo = tmp_path / "archive.tar"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (tmp_path, "a directory")):
        started = time.monotonic()
        with pytest.raises(ImageError, match=rf"^{path}: cannot read: not a regular file \({kind}\): give the "
                                             "archive file itself$"):
            open_archive(str(path))
        assert time.monotonic() - started < 5
        with pytest.raises(ImageError, match=rf"^{path}: not a regular file \({kind}\)"):
            transfer.require_archive_file(str(path))
