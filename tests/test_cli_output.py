"""The text helpers every `gpuckpt` view shares, and store list's --json document (cli/output.py)."""

from __future__ import annotations

import io
import json

from podman_tars import podman_tar

from gpuckpt.cli.main import main
from gpuckpt.cli.output import counted, size_text
from gpuckpt.node.container_record import container_label
from gpuckpt.oci.podman_archive import copy_checked
from gpuckpt.store.repository import Store
from gpuckpt.store.writer import CheckpointWriter

CONTAINER_ID = "c0ffee" * 10 + "abcd"


def test_sizes_keep_a_small_checkpoint_above_zero() -> None:
    """"0 MiB of checkpoint" for a 300 KiB one: the largest unit that keeps the number at 1 or more."""
    assert [size_text(n) for n in (0, 1023, 300 << 10, 5 << 20, (3 << 30) // 2, 40 << 30)] == [
        "0 B", "1023 B", "300 KiB", "5 MiB", "1.5 GiB", "40 GiB"]


def test_counts_and_names() -> None:
    assert [counted(1, "checkpoint"), counted(2, "checkpoint"), counted(0, "chunk")] == [
        "1 checkpoint", "2 checkpoints", "0 chunks"]
    assert container_label("web", CONTAINER_ID) == "web (c0ffeec0ffee)"
    assert container_label(None, CONTAINER_ID) == container_label(CONTAINER_ID, CONTAINER_ID) == "c0ffeec0ffee"


def test_store_list_names_short_ids_and_small_sizes(tmp_path, capsys) -> None:
    root = str(tmp_path / "store")
    with Store(root) as store:
        writer = CheckpointWriter(store, threads=2)
        with store.locked():
            copy_checked(io.BytesIO(podman_tar([("checkpoint/pages-2.img", b"x" * (40 << 10))])), None, "test",
                         observe=writer.observe)
            writer.commit("small", "web", CONTAINER_ID)
    assert main(["store", "list", "--store", root]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["small", "web", "c0ffeec0ffee"] and lines[1].endswith(" KiB")
    assert main(["store", "list", "--json", "--store", root]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert (listed["kind"], listed["store"]) == ("store-list", root)
    row = listed["checkpoints"][0]
    assert (row["name"], row["container_id"], row["short_id"]) == ("small", CONTAINER_ID, "c0ffeec0ffee")


def test_drain_and_gpuckptd_lines_name_the_container_as_podman_ps() -> None:
    """They showed the ID alone (the journal's line no container at all); an older gpuckptd sends no name."""
    from gpuckpt.cli.drain import _line
    from gpuckpt.service.api import ContainerEvent
    from gpuckpt.service.operations import label
    done = ContainerEvent(id=CONTAINER_ID, name="web", engine="podman", phase="checkpoint", state="done",
                          bytes=300 << 10, seconds=1.5)
    assert _line(done) == "checkpoint done    web (c0ffeec0ffee) (podman) (0.3 MiB, 1.5 s)"
    assert _line(done.model_copy(update={"name": ""})).startswith("checkpoint done    c0ffeec0ffee (podman)")
    assert label(done) == "podman container web (c0ffeec0ffee)"


def test_a_drains_plan_counts_one_container_in_the_singular() -> None:
    """The trial of 2026-11-28b: `gpuckpt drain` of one container began "checkpoint 1 containers"."""
    from gpuckpt.cli.drain import _line
    from gpuckpt.service.api import Plan

    assert _line(Plan(phase="checkpoint", containers=1, bytes=31 << 20)) == \
        "checkpoint 1 container (31.0 MiB of host memory now)"
    assert _line(Plan(phase="restore", containers=2, bytes=1 << 20)) == "restore 2 containers (1.0 MiB of checkpoints)"
