"""The CRIU image reader: a real CRIU 4.2 dump parses; hostile files are one ImageError, never a crash."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from criu_image_builder import DEFAULT_CAPS, REAL_DUMP, ImageBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuckpt.errors import ImageError
from gpuckpt.oci import criu_images
from gpuckpt.oci.criu_images import (
    MAX_FILE_BYTES,
    PYCRIU_DIRS,
    _require_root_owned,
    directory_source,
    mapping_source,
    read_checkpoint_images,
)


def read(directory: Path):
    return read_checkpoint_images(directory_source(str(directory)), str(directory))


def test_a_real_criu_dump_reads_as_podman_made_it() -> None:
    images = read(REAL_DUMP)
    assert images.dumper_namespaces["mnt"] != images.tasks[0].namespaces[0]["mnt"]
    (task,) = images.tasks
    assert (task.pid, task.comm, task.alive) == (1, "sleep", True)
    (thread,) = task.threads
    assert thread.creds.cap_eff == thread.creds.cap_bnd == DEFAULT_CAPS
    assert (thread.creds.uid, thread.creds.no_new_privs, thread.seccomp_mode, thread.seccomp_chain) == (
        0,
        False,
        2,
        (0,),
    )


def test_threads_each_have_their_own_credentials(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint(threads=(7,))
    build.write("core-7.img", "CORE", build.core(build.creds(caps={0, 21})))  # seccomp: the leader's, by TSYNC
    (task,) = read(tmp_path).tasks
    assert [(thread.tid, thread.creds.cap_eff) for thread in task.threads] == [(1, DEFAULT_CAPS), (7, {0, 21})]


def test_an_archives_entries_read_like_a_directory(tmp_path: Path) -> None:
    files = {name: (REAL_DUMP / name).read_bytes() for name in os.listdir(REAL_DUMP) if name.endswith(".img")}
    images = read_checkpoint_images(mapping_source(files), "archive:checkpoint")
    assert images.tasks[0].threads[0].creds.cap_eff == DEFAULT_CAPS


@pytest.mark.hostile("core image of a live task without credentials (CRIU would keep root's)")
def test_a_core_without_credentials_is_reported_as_none(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    build.write("core-1.img", "CORE", build.core(thread_core=False))
    assert read(tmp_path).tasks[0].threads[0].creds is None


@pytest.mark.hostile("legacy creds-<pid>.img beside a core without credentials")
def test_the_legacy_creds_image_is_read_where_criu_reads_it(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    core = build.core()
    core.thread_core.ClearField("creds")
    build.write("core-1.img", "CORE", core)
    build.write("creds-1.img", "CREDS", build.creds(caps=set(range(41))))
    assert read(tmp_path).tasks[0].threads[0].creds.cap_eff == frozenset(range(41))


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"\x01\x02\x03\x04" + data[4:], "not a CRIU CORE image"),
    (lambda data: data[:9], "truncated entry header"),
    (lambda data: data[:8] + struct.pack("<I", 1 << 30) + data[12:], "runs past the end"),
    (lambda data: data[:12] + b"\xff" * (len(data) - 12), "not a valid CORE message"),
    (lambda data: data + data[8:], "more than 1 entries"),
    (lambda data: data[:3], "shorter than its magic"),
])
@pytest.mark.hostile("corrupt core image (magic, size, payload, entry count)")
def test_a_corrupt_core_image_is_one_line_naming_it(tmp_path: Path, damage, message) -> None:
    shutil.copytree(REAL_DUMP, tmp_path / "c")
    core = tmp_path / "c" / "core-1.img"
    core.write_bytes(damage(core.read_bytes()))
    with pytest.raises(ImageError, match=message) as refused:
        read(tmp_path / "c")
    assert "core-1.img" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.hostile("core image replaced by a symlink to a host file")
def test_links_fifos_and_oversized_files_are_refused(tmp_path: Path) -> None:
    shutil.copytree(REAL_DUMP, tmp_path / "c")
    core = tmp_path / "c" / "core-1.img"
    core.unlink()
    core.symlink_to(REAL_DUMP / "core-1.img")
    with pytest.raises(ImageError, match="core-1.img: cannot read"):
        read(tmp_path / "c")
    core.unlink()
    os.mkfifo(core)
    with pytest.raises(ImageError, match="core-1.img: not a regular file"):
        read(tmp_path / "c")
    core.unlink()
    core.write_bytes(bytes(MAX_FILE_BYTES + 1))
    with pytest.raises(ImageError, match="more than the"):
        read(tmp_path / "c")
    (tmp_path / "link").symlink_to(tmp_path / "c")
    with pytest.raises(ImageError, match="cannot open the checkpoint directory"):
        read(tmp_path / "link")


@pytest.mark.hostile("images missing the files CRIU needs (pstree, a thread's core)")
def test_missing_files_are_named(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint(threads=(9,))
    (tmp_path / "core-9.img").unlink()
    with pytest.raises(ImageError, match="core-9.img: missing"):
        read(tmp_path)
    (tmp_path / "pstree.img").unlink()
    with pytest.raises(ImageError, match="pstree.img: missing"):
        read(tmp_path)


@pytest.mark.hostile("seccomp filter chain that loops or points past the filters")
def test_seccomp_chains_are_followed_with_bounds(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    build.write("seccomp.img", "SECCOMP", build.pb.seccomp(seccomp_filters=[
        build.filter(bytes(8), prev=1), build.filter(bytes(16), prev=0)]))
    with pytest.raises(ImageError, match="chain loops"):
        read(tmp_path)
    build.write("core-1.img", "CORE", build.core(None, 2, 5))
    with pytest.raises(ImageError, match="filter index 5"):
        read(tmp_path)
    build.write("seccomp.img", "SECCOMP", build.pb.seccomp(seccomp_filters=[build.filter(bytes(8)),
                                                                          build.filter(bytes(16), prev=0)]))
    build.write("core-1.img", "CORE", build.core(None, 2, 1))
    assert read(tmp_path).tasks[0].threads[0].seccomp_chain == (1, 0)


@pytest.mark.hostile("pstree declaring more threads than the reader's cap")
def test_thread_count_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(criu_images, "MAX_THREADS", 3)
    build = ImageBuilder(tmp_path)
    build.checkpoint(threads=(2, 3, 4))
    with pytest.raises(ImageError, match="more than 3 threads"):
        read(tmp_path)


REAL_FILES = {name: (REAL_DUMP / name).read_bytes() for name in os.listdir(REAL_DUMP) if name.endswith(".img")}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(REAL_FILES)), position=st.integers(min_value=0, max_value=10_000),
       patch=st.binary(min_size=1, max_size=16), cut=st.booleans())
@pytest.mark.hostile("fuzzed CRIU images (real dump with bytes replaced or cut)")
def test_fuzzed_images_read_or_fail_with_one_line(name: str, position: int, patch: bytes, cut: bool) -> None:
    data = REAL_FILES[name]
    position %= len(data)
    damaged = data[:position] if cut else data[:position] + patch + data[position + len(patch):]
    try:
        read_checkpoint_images(mapping_source({**REAL_FILES, name: damaged}), "fuzz")
    except ImageError as error:
        assert "\n" not in str(error) and str(error).startswith("fuzz/")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["inventory.img", "pstree.img", "core-1.img", "ids-1.img", "seccomp.img",
                                        "userns-7.img", "creds-1.img"]), st.binary(max_size=200)))
@pytest.mark.hostile("random bytes as every CRIU image the reader opens")
def test_random_images_read_or_fail_with_one_line(files: dict[str, bytes]) -> None:
    try:
        read_checkpoint_images(mapping_source(files), "fuzz")
    except ImageError as error:
        assert "\n" not in str(error)


@pytest.mark.skipif(os.geteuid() != 0, reason="the bindings' directory must be root's")
@pytest.mark.hostile("CRIU's python bindings with a file others may write (code the shim would import as root)")
def test_the_bindings_are_imported_only_from_root_guarded_files() -> None:
    installed = next(path for path in PYCRIU_DIRS if os.path.isdir(path))
    home = tempfile.mkdtemp(dir=os.path.expanduser("~"))  # root's, not world-writable like /tmp
    try:
        copy = Path(home) / "images"
        shutil.copytree(installed, copy)
        _require_root_owned(str(copy))
        (copy / "core_pb2.py").chmod(0o664)
        with pytest.raises(ImageError, match=r"core_pb2.py \(CRIU's python bindings\) is not owned by root or is "
                                             "writable by others"):
            _require_root_owned(str(copy))
    finally:
        shutil.rmtree(home)


@pytest.mark.hostile("process name with a newline and escape codes in core.img")
def test_a_process_name_cannot_break_the_one_line(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    build.write("core-1.img", "CORE", build.core(None, 2, 0, comm="x\nFAKE: ok\x1b[2J"))
    assert read(tmp_path).tasks[0].comm == "x?FAKE: ok?[2J"


def _threads_under(tmp_path: Path, leader_flags: int, thread_3_filtered: bool = False):
    """A leader under one filter flagged `leader_flags`, two threads written without seccomp, as
    CRIU's dump writes threads that shared the leader's filters (thread 3 under its own filter if
    `thread_3_filtered`)."""
    build = ImageBuilder(tmp_path)
    build.checkpoint(threads=(2, 3))
    for tid in (2, 3):
        build.write(f"core-{tid}.img", "CORE", build.core(None, *((2, 0) if tid == 3 and thread_3_filtered
                                                                 else (None, None))))
    entry = build.filter(bytes(8))
    entry.flags = leader_flags
    build.write("seccomp.img", "SECCOMP", build.pb.seccomp(seccomp_filters=[entry]))
    return read(tmp_path).tasks[0].threads


def test_threads_written_without_seccomp_hold_the_leaders_tsync_filters(tmp_path: Path) -> None:
    threads = _threads_under(tmp_path, leader_flags=1)  # SECCOMP_FILTER_FLAG_TSYNC: CRIU syncs every thread
    assert [(thread.seccomp_mode, thread.seccomp_chain) for thread in threads] == [(2, (0,))] * 3


@pytest.mark.hostile("threads written without seccomp under a leader whose filter lacks TSYNC")
def test_without_tsync_the_other_threads_stay_unfiltered(tmp_path: Path) -> None:
    threads = _threads_under(tmp_path, leader_flags=0)  # restored as written: no filter on threads 2 and 3
    assert [thread.seccomp_mode for thread in threads] == [2, 0, 0]


@pytest.mark.hostile("a TSYNC-flagged leader filter beside a thread with filters of its own (CRIU's restore "
                     "can then leave threads unfiltered)")
def test_tsync_other_than_as_criu_writes_it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="flagged TSYNC other than as CRIU writes them"):
        _threads_under(tmp_path, leader_flags=1, thread_3_filtered=True)


@pytest.mark.hostile("a seccomp filter flagged NEW_LISTENER in seccomp.img")
def test_filter_flags_other_than_tsync_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="flags other than TSYNC"):
        _threads_under(tmp_path, leader_flags=1 | 8)


@pytest.mark.hostile("per-task seccomp fields in a core of a multi-threaded process")
def test_old_per_task_seccomp_in_a_threaded_process_is_refused(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint(threads=(2,))
    core = build.core(None, 2, 0)
    core.tc.old_seccomp_mode = 0
    build.write("core-2.img", "CORE", core)
    with pytest.raises(ImageError, match="several threads and per-task seccomp"):
        read(tmp_path)
