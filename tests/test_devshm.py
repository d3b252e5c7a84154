"""transfer/devshm.py: a /dev/shm copied at a leave-running dump: regular files, hard links kept, nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest

from gpuckpt.errors import ImageError
from gpuckpt.oci.spec import Spec
from gpuckpt.transfer import devshm
from gpuckpt.transfer.devshm import NotCopied, copy_directory, dump_devshm
from gpuckpt.transfer.root_files import replace_devshm


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


@pytest.mark.parametrize("mode", [0o4755, 0o2755])
def test_a_set_id_file_leaves_no_copy(shm, tmp_path, mode):
    """A restore applies no set-user/group-ID file (attack30m F1: the copy kept 4755 and every restore of the
    checkpoint was refused): podman's copy stands for such a /dev/shm, as before the copy existed."""
    (shm / "tool").write_bytes(b"#!")
    os.chmod(shm / "tool", mode)
    out = tmp_path / devshm.DUMP_DEVSHM
    with pytest.raises(NotCopied, match="'tool' is set-user-ID or set-group-ID"):
        _copy(shm, out)
    assert not out.exists()


def _bundle_with_copies(tmp_path):
    """A podman-shaped bundle whose /dev/shm bind is its own shm directory, and an image directory holding the
    dump's copy (one file)."""
    bundle = tmp_path / "overlay-containers" / ("c" * 64) / "userdata"
    (bundle / "shm").mkdir(parents=True)
    images = tmp_path / "images"
    images.mkdir()
    (tmp_path / "dumped").mkdir()
    (tmp_path / "dumped" / "board").write_bytes(b"at the dump")
    assert _copy(tmp_path / "dumped", images / devshm.DUMP_DEVSHM) == (1, 11)
    spec = Spec.model_validate({"mounts": [{"destination": "/dev/shm", "type": "bind", "options": ["rbind"],
                                            "source": str(bundle / "shm")}]})
    return spec, bundle, images


def test_the_dump_copy_replaces_the_engines_later_one(tmp_path):
    spec, bundle, images = _bundle_with_copies(tmp_path)
    (bundle / "shm" / "board").write_bytes(b"later")
    (bundle / "shm" / "extra").write_bytes(b"written after the dump")
    done = replace_devshm(spec, str(bundle), str(images), "restore of c")
    assert done.startswith("/dev/shm as copied at the dump (1 entries)")
    assert sorted(os.listdir(bundle / "shm")) == ["board"] and (bundle / "shm" / "board").read_bytes() == b"at the dump"


def test_an_engine_copy_nested_past_the_recursion_limit_is_a_one_line_refusal(tmp_path):
    """attack30m F2: an archive's devshm-checkpoint.tar (outside the signature) of a 1500-deep directory chain,
    unpacked by podman, ended the shim's replacement with RecursionError (an internal error, exit 125)."""
    spec, bundle, images = _bundle_with_copies(tmp_path)
    deep = os.open(bundle / "shm", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(sys.getrecursionlimit() + 200):
            os.mkdir("d", dir_fd=deep)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=deep)
            os.close(deep)
            deep = inner
    finally:
        os.close(deep)
    try:
        with pytest.raises(ImageError, match="nests directories too deep to replace"):
            replace_devshm(spec, str(bundle), str(images), "restore of c")
    finally:  # rm's removal does not recurse in Python: pytest's clean-up of old temporary folders would
        subprocess.run(["rm", "-rf", str(bundle / "shm" / "d")], check=True)
