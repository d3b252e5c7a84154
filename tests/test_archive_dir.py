"""gpuckptd's archive directory: what it restores at boot is only what root alone could have put there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuckpt.errors import ConfigError
from gpuckpt.node.config import ServiceConfig
from gpuckpt.oci.service_api import DrainedContainer
from gpuckpt.service.operations import Operations, drained

RECORD = DrainedContainer(id="a" * 64, engine="podman", checkpoint="/var/lib/gpuckpt/drain/a.tar.zst",
                          drained_at="2026-11-25T07:00:00Z", bytes=1, seconds=1.0)


def _archive_dir(tmp_path: Path, mode: int) -> Path:
    directory = tmp_path / "drain"
    directory.mkdir()
    directory.chmod(mode)
    (directory / f"{RECORD.id}.json").write_text(RECORD.model_dump_json())
    return directory


@pytest.mark.hostile("a local user who may write in the archive directory plants a drain record for the boot's restore")
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_directory_others_may_write_is_refused_for_status_restore_and_drain(node: Path, tmp_path: Path,
                                                                             mode: int) -> None:
    directory = _archive_dir(tmp_path, mode)
    operations = Operations(ServiceConfig(archive_dir=str(directory)))
    for call in (lambda: drained(str(directory)), operations.status, lambda: operations.restore(lambda _: None),
                 lambda: operations.drain(lambda _: None)):
        with pytest.raises(ConfigError, match=f"mode {mode:o}: checkpoints are kept only where uid"):
            call()


@pytest.mark.hostile("a drain record that is a link to a file elsewhere")
def test_records_are_read_without_following_links(tmp_path: Path) -> None:
    directory = _archive_dir(tmp_path, 0o700)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(RECORD.model_copy(update={"id": "b" * 64}).model_dump_json())
    os.symlink(elsewhere, directory / f"{'b' * 64}.json")
    assert [record.id for record in drained(str(directory))] == [RECORD.id]


def test_a_missing_directory_is_nothing_drained(tmp_path: Path) -> None:
    assert drained(str(tmp_path / "none")) == []
