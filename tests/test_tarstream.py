"""The tar stream re-emitted for podman says only what was checked, and hostile headers are one
line; files gpuckpt creates or reads where others could have put something first."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import threading

import pytest

from gpuckpt.errors import ImageError
from gpuckpt.host.safefiles import create_new, read_bounded
from gpuckpt.oci.podman_archive import copy_checked


def tar_of(*infos: tuple[tarfile.TarInfo, bytes], pax: dict | None = None, end: bytes = b"") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers=pax or {}) as tar:
        for info, data in infos:
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue() + end


def entry(name: str, data: bytes = b"x", **attributes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attributes.items():
        setattr(info, key, value)
    return info, data


def test_nothing_of_the_input_header_passes_but_name_type_size_mode_bits_and_mtime() -> None:
    info, data = entry("checkpoint/pages-1.img", b"p" * 700, uid=1000, gid=1000, uname="evil", gname="evil",
                       mode=0o6755, mtime=1700000000.5)
    info.pax_headers = {"SCHILY.xattr.security.capability": "x", "comment": "hi"}
    out = io.BytesIO()
    copy_checked(io.BytesIO(tar_of((info, data))), out, "a.tar")
    out.seek(0)
    with tarfile.open(fileobj=out) as again:
        member = again.next()
        assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "root", "root")
        assert member.mode == 0o755 and member.mtime == 1700000000 and member.pax_headers == {}
        assert again.extractfile(member).read() == data


@pytest.mark.parametrize("pax, message", [
    ({"GNU.sparse.realsize": "0"}, "PAX records \\['GNU.sparse.realsize'\\]: refused"),
    ({"GNU.sparse.realsize": "zz"}, "a bad header|PAX records"),
    ({"VENDOR.whatever": "1"}, "PAX records \\['VENDOR.whatever'\\]: refused"),
])
def test_pax_records_that_readers_disagree_on_are_refused(pax, message) -> None:
    info, data = entry("a", b"y" * 512)
    info.pax_headers = pax
    with pytest.raises(ImageError, match=message):
        copy_checked(io.BytesIO(tar_of((info, data))), None, "a.tar")


def test_chained_extension_headers_and_negative_sizes_are_one_line() -> None:
    block = tarfile.TarInfo("././@PaxHeader")
    block.type, block.size = tarfile.XHDTYPE, 0
    chained = block.tobuf(tarfile.USTAR_FORMAT) * 400 + tar_of(entry("a"))
    with pytest.raises(ImageError, match="extension headers .* before one entry: refused"):
        copy_checked(io.BytesIO(chained), None, "a.tar")
    negative = bytearray(tar_of(entry("a", b"z" * 10)))
    negative[124:136] = b"\xff" * 12  # base-256 size field: -1
    header = negative[:512]
    header[148:156] = b" " * 8
    negative[148:156] = f"{sum(header):06o}\0 ".encode()
    with pytest.raises(ImageError, match="declares -1 bytes"):
        copy_checked(io.BytesIO(bytes(negative)), None, "a.tar")


def test_data_after_the_end_of_archive_is_refused() -> None:
    with pytest.raises(ImageError, match="data after the end-of-archive blocks"):
        copy_checked(io.BytesIO(tar_of(entry("a"), end=b"hidden")), None, "a.tar")


def test_a_private_file_never_inherits_what_was_there(tmp_path) -> None:
    stale = tmp_path / "out.partial"
    stale.write_text("old")
    stale.chmod(0o666)
    os.close(create_new(str(stale)))
    assert stat.S_IMODE(stale.stat().st_mode) == 0o600 and stale.read_text() == ""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(victim)
    os.close(create_new(str(link)))
    assert victim.read_text() == "keep" and not link.is_symlink()


def test_bounded_reads_refuse_fifos_links_and_big_files(tmp_path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = []
    reader = threading.Thread(target=lambda: result.append(pytest.raises(ImageError, read_bounded, str(fifo), 10, "f")))
    reader.start()
    reader.join(5)
    assert not reader.is_alive() and "not a regular file" in str(result[0].value)
    (tmp_path / "big").write_bytes(b"x" * 11)
    with pytest.raises(ImageError, match="larger than 10 bytes"):
        read_bounded(str(tmp_path / "big"), 10, "big")
    (tmp_path / "link").symlink_to(tmp_path / "big")
    with pytest.raises(ImageError, match="cannot read"):
        read_bounded(str(tmp_path / "link"), 100, "link")


class ZerosForever(io.RawIOBase):
    """`prefix`, then /dev/zero: counts what was read."""

    def __init__(self, prefix: bytes) -> None:
        self.prefix, self.read_bytes = prefix, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        count = len(buffer)
        if self.read_bytes < len(self.prefix):
            part = self.prefix[self.read_bytes:self.read_bytes + count]
            buffer[:len(part)] = part
            count = len(part)
        else:
            buffer[:] = bytes(count)
        self.read_bytes += count
        return count


@pytest.mark.hostile("endless zeros after the end-of-archive blocks (a small compressed archive of terabytes)")
def test_zeros_after_the_end_are_bounded() -> None:
    copy_checked(io.BytesIO(tar_of(entry("a")) + bytes(10240)), None, "a.tar")  # GNU tar's record padding
    endless = ZerosForever(tar_of(entry("a")))
    with pytest.raises(ImageError, match="more than 16 MiB of zeros after the end-of-archive blocks"):
        copy_checked(endless, None, "a.tar")
    assert endless.read_bytes < 64 << 20
