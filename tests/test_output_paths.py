"""`gpuckpt export -o FILE` and `-o oci:DIR`: made through descriptors, never through a link
planted or swapped in where the output goes (the directory above it is the operator's)."""

from __future__ import annotations

import io
import os
import stat

import pytest
from podman_tars import podman_tar

from gpuckpt.errors import UsageError
from gpuckpt.oci.image_layout import CheckpointImageWriter, read_layout
from gpuckpt.oci.podman_archive import ArchiveWriter, check_podman_archive, copy_checked, described


def victim(tmp_path):
    """A directory of root's that a link points at: nothing may land there, its mode stays."""
    target = tmp_path / "victim"
    target.mkdir()
    target.chmod(0o755)
    return target


def write_layer(writer: CheckpointImageWriter) -> None:
    kept = {}
    copied = copy_checked(io.BytesIO(podman_tar()), writer.layer(), "podman.tar", kept=kept)
    writer.finish(described("podman.tar", kept, copied.names, copied.files, copied.bytes))


@pytest.mark.hostile("a symlink planted where `export -o oci:DIR` makes its directory")
def test_a_link_planted_at_the_layout_directory_is_not_followed(tmp_path) -> None:
    target = victim(tmp_path)
    (tmp_path / "img").symlink_to(target)
    with pytest.raises(UsageError, match="already exists; give a new directory, or an empty one of yours"):
        CheckpointImageWriter(str(tmp_path / "img"), "t")
    assert os.listdir(target) == [] and stat.S_IMODE(target.stat().st_mode) == 0o755
    assert os.readlink(tmp_path / "img") == str(target)  # left as it was


@pytest.mark.hostile("the layout directory swapped for a symlink while the export writes")
def test_a_layout_directory_swapped_for_a_link_meanwhile_is_not_followed(tmp_path) -> None:
    target = victim(tmp_path)
    writer = CheckpointImageWriter(str(tmp_path / "img"), "t")
    os.rename(tmp_path / "img", tmp_path / "moved")  # what a racing process can do between the calls
    (tmp_path / "img").symlink_to(target)
    write_layer(writer)
    assert os.listdir(target) == [] and stat.S_IMODE(target.stat().st_mode) == 0o755
    assert read_layout(str(tmp_path / "moved"), "t").manifest.annotations  # all of it went where it was made


def test_a_linked_parent_is_the_operators_and_missing_directories_are_made_private(tmp_path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    write_layer(CheckpointImageWriter(str(tmp_path / "link" / "a" / "b" / "img"), "t"))
    assert read_layout(str(real / "a" / "b" / "img"), "t").tag == "t"
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o700
               for path in (real / "a", real / "a" / "b", real / "a" / "b" / "img", real / "a" / "b" / "img" / "blobs"))


def test_an_empty_directory_of_ours_is_used_and_emptied_again_on_failure(tmp_path) -> None:
    (tmp_path / "img").mkdir(mode=0o755)
    writer = CheckpointImageWriter(str(tmp_path / "img"), "t")
    assert stat.S_IMODE((tmp_path / "img").stat().st_mode) == 0o700  # fchmod through the descriptor
    writer.layer().write(b"half")
    writer.discard()
    assert os.listdir(tmp_path / "img") == []
    made = CheckpointImageWriter(str(tmp_path / "new"), "t")
    made.discard()
    assert sorted(os.listdir(tmp_path)) == ["img"]


@pytest.mark.hostile("symlinks planted at the archive and at its .partial file")
def test_links_at_the_archive_and_its_partial_file_are_replaced_not_followed(tmp_path) -> None:
    target = tmp_path / "victim.txt"
    target.write_text("keep")
    path = tmp_path / "out.tar.zst"
    path.symlink_to(target)
    (tmp_path / "out.tar.zst.partial").symlink_to(target)
    writer = ArchiveWriter(str(path))
    copy_checked(io.BytesIO(podman_tar()), writer.layer(), "podman.tar")
    writer.finish(None)
    assert target.read_text() == "keep" and not path.is_symlink()
    assert check_podman_archive(str(path)).config.name == "web"
    assert sorted(os.listdir(tmp_path)) == ["out.tar.zst", "victim.txt"]
