"""Where a checkpoint's images lie: root signs them at dump and verifies, then reads, them by name at
restore, so another user who may write there, move the directory or a directory above it, or point a
link on the way elsewhere, could have root sign or read what they put there. Through the fake runtime
and driver (test_gpu_verbs' node), as root."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import test_gpu_verbs
from test_gpu_verbs import checkpointed_node, restore_args

from gpuckpt.cuda.node import NodeGpus
from gpuckpt.errors import ImageError
from gpuckpt.host.safefiles import require_image_directory_private
from gpuckpt.oci.manifest import read_manifest
from gpuckpt.shim import restore
from gpuckpt.shim.argv import parse_runtime_args
from gpuckpt.trust.dump_signature import DUMP_SIGNATURE

make_node = test_gpu_verbs.make_node
NOBODY = 65534


def restore_from(node, image_dir: str) -> int:
    args = parse_runtime_args(["--root", "/r", "restore", "-d", "--bundle", str(node.bundle), "--image-path",
                               image_dir, "ctr"])
    return restore.run(args, str(node.runtime), NodeGpus(**node.gpus))


@pytest.mark.hostile("a checkpoint's image directory owned by another user (who may put files there to be signed)")
def test_a_checkpoint_into_a_directory_another_user_owns_is_refused_before_anything_runs(make_node) -> None:
    node = make_node(1)
    node.images.mkdir()
    os.chown(node.images, NOBODY, NOBODY)
    with pytest.raises(ImageError) as refused:
        node.checkpoint()
    message = str(refused.value)
    assert "\n" not in message and f"checkpoint of ctr: {node.images}: owned by uid {NOBODY}" in message
    assert "checkpoint" not in node.verbs_called() and node.all_running()
    assert not os.path.exists(node.images / DUMP_SIGNATURE)


@pytest.mark.hostile("a restore's image directory under a directory any user may write in (not sticky)")
def test_a_restore_from_below_a_directory_others_may_write_is_refused_unread(make_node, monkeypatch, tmp_path) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    parent = tmp_path / "open"
    parent.mkdir()
    images = node.images.rename(parent / "images")
    before = len(node.calls())
    parent.chmod(0o777)
    with pytest.raises(ImageError) as refused:
        restore_from(node, str(images))
    message = str(refused.value)
    assert "\n" not in message and f"{parent}: mode 777" in message and "another user may move" in message
    assert len(node.calls()) == before  # the delegate was never called
    parent.chmod(0o755)
    assert restore_from(node, str(images)) == 0  # once closed again


@pytest.mark.hostile("a restore's image path through a link another user owns (who may point it elsewhere)")
def test_a_restore_through_a_link_another_user_owns_is_refused(make_node, monkeypatch, tmp_path) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    link = tmp_path / "theirs"
    link.symlink_to(node.images)
    os.lchown(link, NOBODY, NOBODY)
    before = len(node.calls())
    with pytest.raises(ImageError, match=f"{link}: a link owned by uid {NOBODY}"):
        restore_from(node, str(link))
    assert len(node.calls()) == before


def test_a_checkpoint_directory_not_made_yet_is_judged_by_the_directories_above(tmp_path) -> None:
    require_image_directory_private(str(tmp_path / "not" / "made"), "checkpoint of ctr", make=True)
    assert (tmp_path / "not" / "made").is_dir()
    tmp_path.chmod(0o777)  # not sticky: another user may move what root makes here
    with pytest.raises(ImageError, match="another user may move"):
        require_image_directory_private(str(tmp_path / "made-later"), "checkpoint of ctr", make=True)
    assert not (tmp_path / "made-later").exists()  # refused before anything was made
    tmp_path.chmod(0o700)


@pytest.mark.hostile("a signed dump with inventory.img removed and its manifest replaced by bytes no parser accepts")
def test_a_dump_without_inventory_is_still_verified_before_its_manifest_is_read(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    test_gpu_verbs.signed_as_criu_leaves_it(node)
    (node.images / "inventory.img").unlink()
    manifest = node.images / "gpuckpt-manifest.json"
    manifest.write_bytes(b"{" * manifest.stat().st_size)
    with pytest.raises(ImageError, match="signed at dump: refused"):  # the signature's words, not a parser's
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))


@pytest.mark.hostile("an unsigned image directory whose gpuckpt-manifest.json is a FIFO")
def test_a_manifest_that_is_a_fifo_is_refused_without_waiting(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    (node.images / "inventory.img").write_bytes(b"\x01" * 64)
    (node.images / DUMP_SIGNATURE).unlink(missing_ok=True)
    (node.images / "gpuckpt-manifest.json").unlink()
    os.mkfifo(node.images / "gpuckpt-manifest.json")
    with pytest.raises(ImageError, match="gpuckpt-manifest.json: not a regular file"):
        read_manifest(str(node.images))
    started = time.monotonic()
    with pytest.raises(ImageError, match="has no gpuckpt-dump.sig"):  # the manifest only words a refusal
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert time.monotonic() - started < 10


def test_no_dump_at_all_is_the_delegates_to_refuse(make_node, tmp_path) -> None:
    node = make_node(1)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert restore_from(node, str(empty)) == 0  # the fake runtime restores anything: nothing of ours refused it
    assert "restore" in node.verbs_called()


def test_a_checkpoint_makes_its_image_directory_root_only_before_anything_else_can(make_node, tmp_path) -> None:
    node = make_node(1)
    sticky = tmp_path / "sticky"
    sticky.mkdir(mode=0o1777)
    sticky.chmod(0o1777)  # as /tmp: another user may make the name first, but not move root's away
    node.images = sticky / "not-yet" / "images"
    assert node.checkpoint() == 0
    for made in (node.images, node.images.parent):
        status = made.stat()
        assert status.st_uid == 0 and status.st_mode & 0o077 == 0, oct(status.st_mode)
    assert (node.images / DUMP_SIGNATURE).exists()  # signed there


@pytest.mark.hostile("an image directory another user made first, in a sticky directory, before root's checkpoint")
def test_a_checkpoint_into_a_directory_another_user_made_first_is_refused(make_node, tmp_path) -> None:
    node = make_node(1)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    node.images = sticky / "images"
    node.images.mkdir(mode=0o777)
    os.chown(node.images, NOBODY, NOBODY)
    with pytest.raises(ImageError, match=f"owned by uid {NOBODY}, mode 7"):
        node.checkpoint()
    assert "checkpoint" not in node.verbs_called() and node.all_running()


@pytest.mark.hostile("a restore from an image directory that does not exist (another user may rename one there)")
def test_a_restore_from_a_directory_that_is_not_there_is_refused(make_node, tmp_path) -> None:
    node = make_node(1)
    before = len(node.calls())
    with pytest.raises(ImageError, match=f"{tmp_path}/absent does not exist: no checkpoint images there"):
        restore_from(node, str(tmp_path / "absent"))
    assert len(node.calls()) == before


@pytest.mark.hostile("an image path with '..' after a link (the kernel follows the link first, a text check does not)")
def test_an_image_path_with_dot_dot_is_refused(make_node, monkeypatch, tmp_path) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "l").symlink_to("a/b")
    dotted = f"{tmp_path}/l/../../images"
    before = len(node.calls())
    with pytest.raises(ImageError, match="an image path with '..' is refused"):
        restore_from(node, dotted)
    assert len(node.calls()) == before
    node.images = Path(dotted)
    with pytest.raises(ImageError, match="an image path with '..' is refused"):
        node.checkpoint()


@pytest.mark.hostile("an image directory that is itself sticky and world-writable (a fresh tmpfs's root, /tmp)")
def test_an_image_directory_others_may_add_files_to_is_refused_even_if_sticky(tmp_path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    images.chmod(0o1777)  # others cannot remove root's files, but may add their own, to be signed
    with pytest.raises(ImageError, match="owned by uid 0, mode 1777: checkpoint images are written and read only"):
        require_image_directory_private(str(images), "checkpoint of ctr", make=True)


@pytest.mark.hostile("a checkpoint's --work-path another user made (CRIU, as root, writes its log there)")
def test_a_work_path_another_user_owns_is_refused_before_the_dump(make_node, tmp_path) -> None:
    node = make_node(1)
    work = tmp_path / "work"
    work.mkdir(mode=0o777)
    os.chown(work, NOBODY, NOBODY)
    with pytest.raises(ImageError, match=f"checkpoint of ctr: --work-path: {work}: owned by uid {NOBODY}"):
        node.checkpoint("--work-path", str(work))
    assert "checkpoint" not in node.verbs_called() and node.all_running()


def test_a_work_path_that_is_roots_link_to_a_directory_is_taken(make_node, tmp_path) -> None:
    node = make_node(1)
    (tmp_path / "work-target").mkdir(mode=0o700)
    (tmp_path / "work").symlink_to(tmp_path / "work-target")  # as containerd's bundle links its work directory
    assert node.checkpoint("--work-path", str(tmp_path / "work")) == 0
