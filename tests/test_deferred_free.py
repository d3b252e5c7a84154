"""A restored checkpoint's large files held open past the engine's removal, and freed by the holder
(host/deferred_free.py): which files are held, that removal frees them only in the holder, and that
the holder ends on its own either way."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from gpuckpt.host.deferred_free import MAX_HELD, holder_argv, open_large_files
from gpuckpt.host.process import start_detached

MIB = 1 << 20


def _write(path: Path, size: int) -> None:
    path.write_bytes(b"\x5a" * size)


def _held_names(fds: list[int]) -> set[str]:
    return {os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) for fd in fds}


def _fd_targets(pid: int) -> dict[int, str]:
    targets = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:
            pass
    return targets


def _ended(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ended, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if ended == pid:
            return True
        time.sleep(0.02)
    return False


def test_only_large_regular_files_are_held(tmp_path: Path) -> None:
    _write(tmp_path / "pages-1.img", 2 * MIB)
    _write(tmp_path / "pages-2.img", 2 * MIB)
    _write(tmp_path / "core-1.img", 4096)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    _write(outside, 4 * MIB)
    (tmp_path / "pages-3.img").symlink_to(outside)  # a link's target is never held
    os.mkfifo(tmp_path / "pages-4.img")  # O_PATH: no open, so no wait for a writer
    (tmp_path / "pages-5.img").mkdir()
    fds = open_large_files(str(tmp_path), min_bytes=MIB)
    try:
        assert _held_names(fds) == {"pages-1.img", "pages-2.img"}
        assert all(not os.get_inheritable(fd) for fd in fds)
    finally:
        for fd in fds:
            os.close(fd)


def test_held_files_are_bounded_and_a_missing_directory_holds_none(tmp_path: Path) -> None:
    for number in range(MAX_HELD + 3):
        _write(tmp_path / f"pages-{number}.img", 2)
    fds = open_large_files(str(tmp_path), min_bytes=1)
    try:
        assert len(fds) == MAX_HELD
    finally:
        for fd in fds:
            os.close(fd)
    assert open_large_files(str(tmp_path / "absent")) == []
    link = tmp_path.parent / f"{tmp_path.name}-link"
    link.symlink_to(tmp_path)
    assert open_large_files(str(link), min_bytes=1) == []  # the image directory itself never through a link


def _holding(directory: Path, size: int, hold_s: float, until_pid: int | None = None) -> tuple[Path, int]:
    """A pages image of `size` bytes in `directory`, and the PID of a holder started on it as a restore starts it
    (with a pidfd of `until_pid`, the container's init, when given)."""
    pages = directory / "pages-1.img"
    _write(pages, size)
    fds = open_large_files(str(directory), min_bytes=MIB)
    until = os.pidfd_open(until_pid) if until_pid else -1
    holder = start_detached(holder_argv(fds, until, hold_s=hold_s), [*fds, *([until] if until >= 0 else [])])
    for fd in [*fds, *([until] if until >= 0 else [])]:
        os.close(fd)
    return pages, holder


def test_removed_file_is_freed_by_the_holder_not_the_remover(tmp_path: Path) -> None:
    pages, holder = _holding(tmp_path, 8 * MIB, hold_s=30)
    # the holder has the file and /dev/null, nothing else of ours
    deadline = time.monotonic() + 5
    while not any(t.endswith("pages-1.img") for t in _fd_targets(holder).values()):
        assert time.monotonic() < deadline, "the holder never held the file"
        time.sleep(0.02)
    assert {target for fd, target in _fd_targets(holder).items() if fd <= 2} == {"/dev/null"}
    assert os.getsid(holder) == holder
    blocks_before = os.statvfs(tmp_path).f_bfree
    pages.unlink()  # the engine's removal: only the name goes while the holder has it
    assert os.statvfs(tmp_path).f_bfree - blocks_before < (4 * MIB) // os.statvfs(tmp_path).f_bsize
    assert _ended(holder, within_s=5), "the holder kept a removed file"
    # freed by the holder's close (the filesystem may settle its counts a little later)
    deadline = time.monotonic() + 5
    while os.statvfs(tmp_path).f_bfree - blocks_before < (6 * MIB) // os.statvfs(tmp_path).f_bsize:
        assert time.monotonic() < deadline, "the removed file's blocks were not freed"
        time.sleep(0.05)


def test_kept_checkpoint_is_let_go_after_the_hold(tmp_path: Path) -> None:
    pages, holder = _holding(tmp_path, 2 * MIB, hold_s=0.3)
    assert _ended(holder, within_s=5), "the holder outlived its hold"
    assert pages.read_bytes() == b"\x5a" * (2 * MIB)  # kept (`--keep`): untouched


def test_the_hold_ends_with_the_container(tmp_path: Path) -> None:
    """conmon, a subreaper, adopts the holder and waits for it: it must not outlive the container (`--keep`)."""
    init = subprocess.Popen(["sleep", "60"])
    try:
        pages, holder = _holding(tmp_path, 2 * MIB, hold_s=60, until_pid=init.pid)
        time.sleep(0.3)
        assert not _ended(holder, within_s=0.1), "the holder let go before the container ended"
        init.kill()
        init.wait()
        assert _ended(holder, within_s=5), "the holder outlived the container"
        assert pages.read_bytes() == b"\x5a" * (2 * MIB)
    finally:
        init.kill()
        init.wait()
