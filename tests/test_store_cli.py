"""`gpuckpt store` verbs that need no engine, on a store of real files: show, list, verify, remove, prune,
and bad input as one line."""

from __future__ import annotations

import io
import json
import os
import random

import pytest
from podman_tars import podman_tar

from gpuckpt.cli.main import main
from gpuckpt.oci.podman_archive import copy_checked
from gpuckpt.store.repository import Store
from gpuckpt.store.writer import CheckpointWriter


@pytest.fixture
def filled(tmp_path) -> str:
    root = str(tmp_path / "store")
    shared = random.Random(0).randbytes(3 << 20)
    with Store(root) as store:
        for number in range(3):
            tar = podman_tar([("checkpoint/pages-2.img", shared + random.Random(number).randbytes(1 << 20))])
            writer = CheckpointWriter(store, threads=2)
            with store.locked():
                copy_checked(io.BytesIO(tar), None, "test", observe=writer.observe)
                writer.commit(f"web-{number}", "web", "c0ffee" * 10 + "abcd")
    return root


def gpuckpt(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["store", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_show_counts_new_and_shared_bytes(filled, capsys) -> None:
    status, out, _ = gpuckpt(capsys, "show", "--json", "--store", filled)
    shown = json.loads(out)
    rows = {row["name"]: row for row in shown["checkpoints"]}
    assert status == 0 and list(rows) == ["web-0", "web-1", "web-2"]
    assert rows["web-0"]["new_bytes"] > 3 << 20 and rows["web-1"]["new_bytes"] < 2 << 20
    assert all(row["shared_bytes"] >= 2 << 20 for row in rows.values())  # the shared 3 MiB, less its last chunk
    assert shown["chunk_bytes"] < shown["logical_bytes"]
    status, out, _ = gpuckpt(capsys, "show", "--store", filled)
    assert status == 0 and "web-2" in out and "3 checkpoints" in out
    status, out, _ = gpuckpt(capsys, "list", "--store", filled)
    assert status == 0 and out.count("web-") == 3


def test_verify_names_the_bad_chunk_and_the_checkpoints_it_breaks(filled, capsys) -> None:
    status, out, _ = gpuckpt(capsys, "verify", "--store", filled)
    assert status == 0 and "all intact" in out
    manifest = json.loads(open(os.path.join(filled, "checkpoints", "web-1.json")).read())
    digest = next(entry for entry in manifest["entries"] if entry["name"] == "checkpoint/pages-2.img")["chunks"][0][0]
    os.unlink(os.path.join(filled, "chunks", digest[:2], digest))
    status, out, err = gpuckpt(capsys, "verify", "--store", filled)
    assert status == 3 and digest in out and "missing" in out
    assert len(err.strip().splitlines()) == 1 and "web-0, web-1, web-2 cannot be restored" in err


def test_prune_and_remove(filled, capsys) -> None:
    status, out, _ = gpuckpt(capsys, "prune", "--keep", "2", "--store", filled)
    assert status == 0 and "removed web-0" in out
    status, out, _ = gpuckpt(capsys, "remove", "web-1", "--store", filled)
    assert status == 0 and "removed web-1; collected" in out
    status, out, _ = gpuckpt(capsys, "verify", "--store", filled)
    assert status == 0 and "verified 1 checkpoint: " in out and "no checkpoint names" not in out


@pytest.mark.parametrize("argv, needle", [
    (("restore", "../etc"), "letters, digits"),
    (("remove", "nothere"), "no checkpoint 'nothere'"),
    (("prune", "--keep", "-1"), "--keep -1"),
    (("verify", "a/b"), "letters, digits"),
    (("export", "web-0", "/nonexistent-dir/x.tar.zst"), "no such directory"),
])
def test_bad_input_is_one_line(filled, capsys, argv, needle) -> None:
    status, out, err = gpuckpt(capsys, *argv, "--store", filled)
    assert status != 0 and len(err.strip().splitlines()) == 1 and needle in err, err
