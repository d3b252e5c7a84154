"""CRIU's link-remap names put back after a leave-running dump: the images read (a real CRIU 4.2 dump of a
named semaphore, and hostile ones), and the link made through descriptors to a file a real process holds
under a removed name (shim/link_remap.py, host/held_links.py)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from criu_image_builder import ImageBuilder
from support import ready_children

from gpuckpt.errors import ImageError
from gpuckpt.host.held_links import held_files, link_in_root, remove_links_in_root
from gpuckpt.host.processes import read_processes
from gpuckpt.oci.criu_images import (
    FD_TYPE_REG,
    LINK_REMAP_NAME,
    REMAP_TYPE_LINKED,
    LinkRemap,
    directory_source,
    read_link_remaps,
)
from gpuckpt.shim.link_remap import put_back_link_remaps, remove_left_link_remaps

REAL_DUMP = Path(__file__).parent / "data" / "criu-link-remap"  # podman 4.3 + runc + CRIU 4.2.1: a semaphore
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="linkat AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH (root)")

# sem_open's three steps (a random name made, linked under the semaphore's name, removed), then held: open, or
# mapped with its descriptor closed as glibc leaves it
HOLDER = """
import mmap, os, sys, time
directory, how = sys.argv[1], sys.argv[2]
fd = os.open(f"{directory}/sem.tmpXYZ", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, bytes(32))
os.link(f"{directory}/sem.tmpXYZ", f"{directory}/sem.lock")
os.unlink(f"{directory}/sem.tmpXYZ")
if how == "mapped":
    mapping = mmap.mmap(fd, 32)
    os.close(fd)
print("ready", flush=True)
time.sleep(60)
"""


def read(directory: Path) -> list[LinkRemap]:
    return read_link_remaps(directory_source(str(directory)), str(directory))


def test_a_real_dump_names_its_link_remap() -> None:
    assert read(REAL_DUMP) == [LinkRemap("/dev/shm/link_remap.16", "/dev/shm/sem.gpuckptTmp")]


def test_a_dump_without_link_remaps_has_none(tmp_path: Path) -> None:
    assert read(tmp_path) == []
    build = ImageBuilder(tmp_path)
    build.write("remap-fpath.img", "REMAP_FPATH", build.pb.remap(orig_id=1, remap_id=2, remap_type=1))  # GHOST
    assert read(tmp_path) == []


def write_remap(build: ImageBuilder, removed: str, made: str, *, files: str = "files.img") -> None:
    build.write("remap-fpath.img", "REMAP_FPATH", build.pb.remap(orig_id=5, remap_id=6, remap_type=REMAP_TYPE_LINKED))
    entries = []
    for file_id, name in ((5, removed), (6, made)):
        reg = build.pb.reg_file(id=file_id, flags=0, pos=0, name=name)
        reg.fown.uid = reg.fown.euid = reg.fown.signum = reg.fown.pid_type = reg.fown.pid = 0
        entries.append(reg if files == "reg-files.img" else build.pb.file(type=FD_TYPE_REG, id=file_id, reg=reg))
    build.write(files, "REG_FILES" if files == "reg-files.img" else "FILES", *entries)


def test_an_older_criu_reg_files_image_reads_the_same(tmp_path: Path) -> None:
    write_remap(ImageBuilder(tmp_path), "/dev/shm/sem.a", "/dev/shm/link_remap.6", files="reg-files.img")
    assert read(tmp_path) == [LinkRemap("/dev/shm/link_remap.6", "/dev/shm/sem.a")]


@pytest.mark.parametrize("made", ["/etc/link_remap.6", "/dev/shm/passwd", "dev/shm/link_remap.6",
                                  "/dev/shm/../shm/link_remap.6", "/dev/shm/x/link_remap.6", "/dev/shm/link_remap.6x"])
def test_a_remap_name_criu_would_not_make_is_refused(tmp_path: Path, made: str) -> None:
    write_remap(ImageBuilder(tmp_path), "/dev/shm/sem.a", made)
    with pytest.raises(ImageError, match="is not CRIU's link_remap.N in a directory above it"):
        read(tmp_path)


def test_criu_s_grandparent_fallback_is_accepted(tmp_path: Path) -> None:
    write_remap(ImageBuilder(tmp_path), "/dev/shm/gone/sem.a", "/dev/shm/link_remap.6")
    assert read(tmp_path) == [LinkRemap("/dev/shm/link_remap.6", "/dev/shm/gone/sem.a")]


def test_a_remap_of_a_file_the_images_lack_is_refused(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.write("remap-fpath.img", "REMAP_FPATH", build.pb.remap(orig_id=5, remap_id=6, remap_type=REMAP_TYPE_LINKED))
    with pytest.raises(ImageError, match="files.img: missing"):
        read(tmp_path)
    build.write("files.img", "FILES")
    with pytest.raises(ImageError, match="link-remap of file id 5, which files.img does not hold"):
        read(tmp_path)


def test_a_truncated_remap_image_is_one_error(tmp_path: Path) -> None:
    shutil.copy(REAL_DUMP / "files.img", tmp_path)
    (tmp_path / "remap-fpath.img").write_bytes((REAL_DUMP / "remap-fpath.img").read_bytes()[:-3])
    with pytest.raises(ImageError, match="remap-fpath.img: entry of"):
        read(tmp_path)


@pytest.fixture
def holder(tmp_path):
    """start(how): a process holding <tmp_path>/sem.tmpXYZ under that removed name while sem.lock still links it."""
    with ready_children() as start:
        yield lambda how: start(HOLDER, str(tmp_path), how)


@ROOT_ONLY
@pytest.mark.parametrize("how", ["open", "mapped"])
def test_the_held_file_is_linked_again_under_the_remap_name(holder, tmp_path: Path, how: str) -> None:
    pid = holder(how)
    lock = (tmp_path / "sem.lock").stat()
    with held_files([pid], f"{tmp_path}/sem.tmpXYZ") as held:
        assert [(file.dev, file.ino) for file in held] == [(lock.st_dev, lock.st_ino)]
        assert link_in_root(held[0], pid, f"{tmp_path}/link_remap.16") is True
        assert link_in_root(held[0], pid, f"{tmp_path}/link_remap.16") is False  # there already: left as it is
    made = (tmp_path / "link_remap.16").stat()
    assert (made.st_ino, made.st_nlink) == (lock.st_ino, 2)


@ROOT_ONLY
def test_a_link_on_the_way_or_another_file_at_the_name_is_refused(holder, tmp_path: Path) -> None:
    pid = holder("mapped")
    (tmp_path / "away").mkdir()
    (tmp_path / "detour").symlink_to(tmp_path / "away")
    (tmp_path / "link_remap.17").write_bytes(b"planted")
    with held_files([pid], f"{tmp_path}/sem.tmpXYZ") as (held,):
        with pytest.raises(OSError) as through_link:
            link_in_root(held, pid, f"{tmp_path}/detour/link_remap.16")
        assert through_link.value.errno == errno.ELOOP
        with pytest.raises(OSError, match="is there already and is another file"):
            link_in_root(held, pid, f"{tmp_path}/link_remap.17")
    assert os.listdir(tmp_path / "away") == []
    assert (tmp_path / "link_remap.17").read_bytes() == b"planted"


@ROOT_ONLY
def test_a_directory_on_another_filesystem_is_refused(holder, tmp_path: Path) -> None:
    pid = holder("open")
    if os.stat("/dev/shm").st_dev == tmp_path.stat().st_dev:
        pytest.skip("/dev/shm and the test's directory are one filesystem here: no other one to link into")
    name = f"link_remap.{os.getpid()}"
    with held_files([pid], f"{tmp_path}/sem.tmpXYZ") as (held,), pytest.raises(OSError) as refused:
        link_in_root(held, pid, f"/dev/shm/{name}")
    assert refused.value.errno == errno.EXDEV and not os.path.exists(f"/dev/shm/{name}")


@ROOT_ONLY
def test_put_back_then_removed_before_the_next_dump(holder, tmp_path: Path) -> None:
    pid = holder("mapped")
    images = tmp_path / "images"
    write_remap(ImageBuilder(images), f"{tmp_path}/sem.tmpXYZ", f"{tmp_path}/link_remap.6")
    processes = read_processes([pid])
    assert put_back_link_remaps(str(images), processes, pid) == [
        LinkRemap(f"{tmp_path}/link_remap.6", f"{tmp_path}/sem.tmpXYZ")]
    assert (tmp_path / "link_remap.6").stat().st_ino == (tmp_path / "sem.lock").stat().st_ino
    (tmp_path / "link_remap.7").write_bytes(b"the container's own")  # not a link of a held file: kept
    assert remove_left_link_remaps(processes, pid) == [f"{tmp_path}/link_remap.6"]
    assert sorted(os.listdir(tmp_path)) == ["images", "link_remap.7", "sem.lock"]


@ROOT_ONLY
def test_a_file_no_longer_held_cannot_be_put_back(holder, tmp_path: Path) -> None:
    pid = holder("open")
    images = tmp_path / "images"
    write_remap(ImageBuilder(images), f"{tmp_path}/sem.other", f"{tmp_path}/link_remap.6")
    with pytest.raises(ImageError, match="cannot be put back: no process holds it any more"):
        put_back_link_remaps(str(images), read_processes([pid]), pid)
    assert not (tmp_path / "link_remap.6").exists()


def test_the_name_pattern_is_criu_s() -> None:
    assert LINK_REMAP_NAME.fullmatch("link_remap.246") and not LINK_REMAP_NAME.fullmatch("link_remap.")
    with held_files([], "/dev/shm/none") as held:
        assert held == []
    assert remove_links_in_root([], os.getpid(), "/dev/shm", LINK_REMAP_NAME) == []
