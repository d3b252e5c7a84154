"""Pages staged by `gpuckpt import` and claimed by the shim's restore: only through the shim's
own record, never through anything an archive carries."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile

import pytest
from podman_tars import podman_tar

from gpuckpt.errors import ImageError
from gpuckpt.node.config import ImportConfig
from gpuckpt.oci.podman_archive import check_podman_archive, copy_checked
from gpuckpt.transfer.bounds import StagingBudget
from gpuckpt.transfer.staging import PLACEHOLDER, ParallelFile, Staging, claim_staged


def stage(node, source: bytes) -> tuple[Staging, bytes]:
    (node / "storage").mkdir(exist_ok=True)
    staging = Staging(str(node / "storage"), StagingBudget("podman.tar", str(node / "storage"), ImportConfig()))
    staging.start()
    light = io.BytesIO()
    copy_checked(io.BytesIO(source), light, "podman.tar", kept={}, divert=staging.divert,
                 trailer=(staging.placeholder(),))
    return staging, light.getvalue()


def unpack(light: bytes, image_dir) -> None:
    """What podman's untar does with the light archive: checkpoint/ becomes the image directory."""
    with tarfile.open(fileobj=io.BytesIO(light)) as tar:
        for member in tar:
            if member.name.startswith("checkpoint/") and member.isfile():
                (image_dir / member.name.split("/", 1)[1]).write_bytes(tar.extractfile(member).read())


def test_pages_go_beside_and_come_back_through_the_record(node) -> None:
    source = podman_tar()
    staging, light = stage(node, source)
    with tarfile.open(fileobj=io.BytesIO(light)) as tar:
        names = tar.getnames()
    assert "checkpoint/pages-1.img" not in names and f"checkpoint/{PLACEHOLDER}" in names
    assert stat.S_IMODE(os.stat(staging.directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(staging.directory, "pages-1.img")).st_mode) == 0o600
    image_dir = node / "userdata" / "checkpoint"
    image_dir.mkdir(parents=True)
    unpack(light, image_dir)
    staging.record()
    claimed = claim_staged(str(image_dir))
    assert claimed is not None and claimed.pages == ["pages-1.img"]
    with tarfile.open(fileobj=io.BytesIO(source)) as tar:
        assert (image_dir / "pages-1.img").read_bytes() == tar.extractfile("checkpoint/pages-1.img").read()
    assert not (image_dir / PLACEHOLDER).exists()
    directory = staging.directory
    staging.remove()
    assert not os.path.exists(directory) and not os.listdir(node / "state" / "imports")


def test_no_placeholder_no_work_and_a_placeholder_without_record_fails_the_restore(node) -> None:
    image_dir = node / "checkpoint"
    image_dir.mkdir()
    assert claim_staged(str(image_dir)) is None
    (image_dir / PLACEHOLDER).write_text(json.dumps({"kind": "gpuckpt-staged-import", "token": "a" * 32}))
    with pytest.raises(ImageError, match="staged by a gpuckpt import that has ended"):
        claim_staged(str(image_dir))
    (image_dir / PLACEHOLDER).write_text(json.dumps({"kind": "gpuckpt-staged-import", "token": "../../etc/x"}))
    with pytest.raises(ImageError, match="not a gpuckpt import placeholder"):
        claim_staged(str(image_dir))


@pytest.mark.hostile("an archive's placeholder whose token is a path to a record the archive carries (F8)")
def test_a_placeholder_token_that_names_a_path_is_refused(node) -> None:
    """The attack of the second review: a token that holds 32 hex digits inside a path passed pydantic's
    (searching) pattern and named a record the archive itself carried, vouching for an unsigned dump."""
    image_dir = node / "checkpoint"
    image_dir.mkdir()
    forged = image_dir / f"x-{'b' * 32}"
    forged.with_suffix(".json").write_text(json.dumps({"token": "b" * 32, "pages_dir": str(image_dir), "pages": [],
                                                       "created": "2026-11-28T00:00:00Z", "vouched": "forged"}))
    for token in (str(forged), f"../../../{forged}", f"{'b' * 32}/../x"):
        (image_dir / PLACEHOLDER).write_text(json.dumps({"kind": "gpuckpt-staged-import", "token": token}))
        with pytest.raises(ImageError, match="not a gpuckpt import placeholder"):
            claim_staged(str(image_dir))


def test_a_record_naming_other_files_is_refused(node) -> None:
    staging, light = stage(node, podman_tar())
    staging.pages = ["../../../etc/shadow"]
    staging.record()
    image_dir = node / "checkpoint"
    image_dir.mkdir()
    unpack(light, image_dir)
    with pytest.raises(ImageError, match="is not a pages image name"):
        claim_staged(str(image_dir))
    staging.remove()


def test_an_archive_carrying_a_placeholder_is_refused(tmp_path) -> None:
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar([(f"checkpoint/{PLACEHOLDER}", b'{"token": "' + b"a" * 32 + b'"}')]))
    with pytest.raises(ImageError, match="import placeholder: refused"):
        check_podman_archive(str(path))


def test_parallel_file_stores_every_byte_in_order(tmp_path) -> None:
    data = os.urandom(5 * ParallelFile.CHUNK_BYTES + 777)
    fd = os.open(tmp_path / "pages-1.img", os.O_WRONLY | os.O_CREAT, 0o600)
    with ParallelFile(fd, threads=3) as staged:
        for at in range(0, len(data), 300001):  # writes that straddle the chunks
            staged.write(memoryview(data)[at:at + 300001])
    assert (tmp_path / "pages-1.img").read_bytes() == data


def test_parallel_file_reports_a_failed_write(tmp_path) -> None:
    fd = os.open(tmp_path / "pages-1.img", os.O_RDONLY | os.O_CREAT, 0o600)  # writes fail: EBADF
    with pytest.raises(OSError):
        with ParallelFile(fd, threads=2) as staged:
            staged.write(bytes(3 * ParallelFile.CHUNK_BYTES))
