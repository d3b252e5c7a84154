"""--leave-running dumps staged in memory (shim/staging.py): where the delegate dumps, and when the images move."""

from __future__ import annotations

import os
import shutil

import pytest
import test_gpu_verbs
from fake_driver import FakeDriver
from support import write_config

from gpuckpt.cuda.driver import ProcessState
from gpuckpt.shim import staging
from gpuckpt.shim.staging import move_staged, staged_argv

make_node = test_gpu_verbs.make_node


def test_the_image_path_the_engine_gave_is_replaced_in_each_spelling() -> None:
    argv = ["--root", "/r", "checkpoint", "--image-path", "/img", "--work-path", "/w", "ctr"]
    assert staged_argv(argv, 2, "/dev/shm/s", "/img", "/w") == [
        "--root", "/r", "checkpoint", "--image-path", "/dev/shm/s", "--work-path", "/w", "ctr"]
    assert staged_argv(["checkpoint", "-image-path=/img", "ctr"], 0, "/s", "/img", "/w") == [
        "checkpoint", "-image-path=/s", "ctr"]


def test_without_a_work_path_criu_logs_where_the_engine_looks(tmp_path) -> None:
    image_dir = str(tmp_path / "img")
    assert staged_argv(["checkpoint", "ctr"], 0, "/s", image_dir, None) == [
        "checkpoint", "--image-path", "/s", "--work-path", image_dir, "ctr"]


def test_a_container_that_would_leave_too_little_memory_is_not_staged(tmp_path) -> None:
    assert staging.staging_refusal_for(1 << 20, str(tmp_path)) is None  # a MiB fits anywhere this runs
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert "would leave less than" in staging.staging_refusal_for(total, str(tmp_path))


def test_staged_files_replace_an_earlier_dumps_and_the_staging_goes(tmp_path) -> None:
    staged, image_dir = tmp_path / "staged", tmp_path / "img"
    staged.mkdir()
    image_dir.mkdir()
    (staged / "pages-1.img").write_bytes(b"new" * 100)
    (image_dir / "pages-1.img").write_bytes(b"old")
    assert move_staged(str(staged), str(image_dir)) == 300
    assert (image_dir / "pages-1.img").read_bytes() == b"new" * 100 and not staged.exists()


def test_a_move_that_fails_drops_the_staged_dump_and_its_partial_copy(tmp_path) -> None:
    """The disk full halfway (here: a directory where an image goes): no memory is left held in /dev/shm."""
    image_dir = tmp_path / "img"
    (image_dir / "pages-1.img").mkdir(parents=True)
    (image_dir / "pages-1.img" / "x").write_text("")
    staged = staging.make_staging_dir()
    try:
        with open(os.path.join(staged, "pages-1.img"), "wb") as image:
            image.write(b"new" * 100)
        with pytest.raises(OSError):
            move_staged(staged, str(image_dir))
        assert not os.path.exists(staged)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    assert sorted(os.listdir(image_dir)) == ["pages-1.img"]


class OrderDriver(FakeDriver):
    """Records whether the images had moved when each process was unlocked."""

    def __init__(self, pids, image_dir, **kwargs) -> None:
        super().__init__(pids, **kwargs)
        self.image_dir, self.moved_at_unlock = image_dir, []

    def unlock(self, pid: int) -> None:
        super().unlock(pid)
        self.moved_at_unlock.append((self.image_dir / "fake-dump.img").exists())


def test_leave_running_dumps_into_memory_and_moves_after_the_unlock(make_node, node) -> None:
    write_config(node, "[cuda]\nstage_leave_running = true\n")
    node = make_node(2)
    node.driver = OrderDriver(node.pids, node.images)
    assert node.checkpoint("--leave-running") == 0
    dump = next(call for call in node.calls() if "checkpoint" in call)
    staged = dump[dump.index("--image-path") + 1]
    assert staged.startswith("/dev/shm/gpuckpt-stage-")  # the delegate dumped into memory
    assert node.driver.moved_at_unlock == [False, False]  # the GPU ran again before the images moved
    assert (node.images / "fake-dump.img").exists() and not os.path.exists(staged)
    assert all(state == ProcessState.RUNNING for state in node.driver.states.values())


def test_without_the_operators_word_the_dump_goes_where_the_engine_said(make_node) -> None:
    node = make_node(1)
    assert node.checkpoint("--leave-running") == 0
    dump = next(call for call in node.calls() if "checkpoint" in call)
    assert dump[dump.index("--image-path") + 1] == str(node.images)


def test_only_a_staging_directory_is_taken_for_one(tmp_path) -> None:
    made = staging.make_staging_dir(str(tmp_path))
    assert staging.is_staging_dir(made, str(tmp_path))
    other = tmp_path / "gpuckpt-stage-link"
    other.symlink_to(made)
    assert not staging.is_staging_dir(str(other), str(tmp_path))
    assert not staging.is_staging_dir(str(tmp_path), str(tmp_path))  # the root itself
    assert not staging.is_staging_dir("/etc", str(tmp_path))
    look_alike = tmp_path / f"{staging.STAGING_PREFIX}other"
    look_alike.mkdir(mode=0o755)  # a local user's (anyone may make one in /dev/shm): not private
    look_alike.chmod(0o755)
    assert not staging.is_staging_dir(str(look_alike), str(tmp_path))
