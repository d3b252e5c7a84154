"""transfer/devshm.py: a /dev/shm copied at a leave-running dump: regular files, hard links kept, nothing else."""

from __future__ import annotations

import os
import tarfile

import pytest

from gpuckpt.transfer import devshm
from gpuckpt.transfer.devshm import NotCopied, copy_directory, dump_devshm


@pytest.fixture
def shm(tmp_path):
    directory = tmp_path / "shm"
    directory.mkdir()
    return directory


def _copy(shm, out):
    fd = os.open(shm, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return copy_directory(fd, str(out))
    finally:
        os.close(fd)


def test_files_are_copied_and_a_hard_link_stays_one_file(shm, tmp_path):
    (shm / "sem.lock").write_bytes(b"\x01" + bytes(31))
    os.link(shm / "sem.lock", shm / "link_remap.7")  # CRIU's name for the semaphore held under a removed name
    (shm / "board").write_bytes(b"posted 41")
    os.chmod(shm / "board", 0o640)
    out = tmp_path / devshm.DUMP_DEVSHM
    assert _copy(shm, out) == (2, 41)
    with tarfile.open(out) as tar:
        members = {member.name: member for member in tar.getmembers()}
        assert sorted(members) == ["board", "link_remap.7", "sem.lock"]
        # the first name in order holds the data, the other links it
        assert members["sem.lock"].islnk() and members["sem.lock"].linkname == "link_remap.7"
        assert tar.extractfile("link_remap.7").read() == b"\x01" + bytes(31)
        assert tar.extractfile("board").read() == b"posted 41" and members["board"].mode == 0o640
    assert dump_devshm(str(tmp_path)) == str(out)


@pytest.mark.parametrize("make, why", [
    (lambda shm: os.symlink("/etc/shadow", shm / "sem.x"), "'sem.x' is not a regular file"),
    (lambda shm: os.mkfifo(shm / "pipe"), "'pipe' is not a regular file"),
    (lambda shm: (shm / "torch_1").mkdir(), "'torch_1' is not a regular file"),
])
def test_anything_but_regular_files_leaves_no_copy(shm, tmp_path, make, why):
    (shm / "a").write_bytes(b"a")
    make(shm)
    out = tmp_path / devshm.DUMP_DEVSHM
    with pytest.raises(NotCopied, match=why):
        _copy(shm, out)
    assert not out.exists() and dump_devshm(str(tmp_path)) == ""


def test_past_the_bounds_leaves_no_copy(shm, tmp_path, monkeypatch):
    (shm / "a").write_bytes(bytes(600))
    (shm / "b").write_bytes(bytes(600))
    monkeypatch.setattr(devshm, "MAX_DEVSHM_BYTES", 1000)
    out = tmp_path / devshm.DUMP_DEVSHM
    with pytest.raises(NotCopied, match="more than 0 MiB"):
        _copy(shm, out)
    assert not out.exists()
    monkeypatch.setattr(devshm, "MAX_DEVSHM_BYTES", 1 << 20)
    monkeypatch.setattr(devshm, "MAX_DEVSHM_FILES", 1)
    with pytest.raises(NotCopied, match="2 entries, more than 1"):
        _copy(shm, out)
    assert not out.exists()
