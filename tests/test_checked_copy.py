"""`gpuckpt import`'s second read of an archive (the checked copy for runtimes other than the shim)
must be of the very file the first pass checked."""

from __future__ import annotations

import os
import time

import pytest

from gpuckpt.cli.transfer import _require_unchanged, file_identity
from gpuckpt.errors import ImageError


@pytest.mark.hostile("an archive its owner rewrites or replaces between import's check and its second read")
@pytest.mark.parametrize("change", ["rewritten", "replaced"])
def test_an_archive_changed_after_its_check_is_refused(tmp_path, change) -> None:
    path = tmp_path / "a.tar.zst"
    path.write_bytes(b"checked bytes")
    checked = file_identity(os.stat(path))
    time.sleep(0.01)
    if change == "rewritten":
        path.write_bytes(b"hostile bytes")  # same size, same inode
    else:
        (tmp_path / "other").write_bytes(b"checked bytes")
        os.replace(tmp_path / "other", path)
    with open(path, "rb") as raw, pytest.raises(ImageError, match="replaced or written since it was checked"):
        _require_unchanged(raw, checked, str(path))


def test_the_same_file_unchanged_passes(tmp_path) -> None:
    path = tmp_path / "a.tar.zst"
    path.write_bytes(b"checked bytes")
    with open(path, "rb") as raw:
        _require_unchanged(raw, file_identity(os.fstat(raw.fileno())), str(path))
