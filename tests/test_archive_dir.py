"""gpuckptd's archive directory: what it restores at boot is only what root alone could have put there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuckpt.errors import ConfigError
from gpuckpt.node.config import ServiceConfig
from gpuckpt.service.api import DrainedContainer
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


@pytest.mark.hostile("a local user who may write in a directory above the archive directory swaps it for a link "
                     "between gpuckptd's check and its prune (seen as root: prune_to_budget removed a root file "
                     "below the link's target)")
@pytest.mark.parametrize(("mode", "refused"), [(0o777, True), (0o775, True), (0o1777, False), (0o755, False)])
def test_an_archive_directory_below_one_others_may_write_is_refused(tmp_path: Path, mode: int, refused: bool) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    directory = shared / "drain"
    directory.mkdir(mode=0o700)
    shared.chmod(mode)  # sticky (/tmp): another user can neither rename nor remove what root made there
    operations = Operations(ServiceConfig(archive_dir=str(directory)))
    for call in (lambda: drained(str(directory)), operations.status):
        if refused:
            with pytest.raises(ConfigError, match=f"{shared}: mode {mode:o}: "):
                call()
        else:
            call()


def test_an_archive_directory_reached_through_a_link_in_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "drain").mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.symlink(tmp_path / "real", shared / "link")
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=f"{shared}: mode 777: "):
        drained(str(shared / "link" / "drain"))
