"""Refusals an operator meets before anything slow: the operator trial of 2026-11-28b (results/) waited 2.4 s for
`gpuckpt import ARCHIVE` (and 5.5 s for `gpuckpt store restore NAME`) to say the archive's container name was
taken, most of it two `podman info` calls made before the name was looked at; and a failed `gpuckpt export` of a
container it had already stopped was "put back" by restoring podman's older checkpoint, starting it.

podman is a stand-in on PATH that logs each call (the order of calls is what is tested); the archive, the store,
the trust policy and the configuration are real files of the test's own."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
from podman_tars import podman_tar
from test_import_bounds import podman43_tar

from gpuckpt.cli.main import main
from gpuckpt.node.engines import podman_registration
from gpuckpt.oci.podman_archive import copy_checked
from gpuckpt.store.repository import Store
from gpuckpt.store.writer import CheckpointWriter

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gpuckpt import, store and export need root (CI runs "
                                                          "as root)")

# `container exists` answers for the names in taken.json and states.json; `container inspect` gives the state
# in states.json; `info` the storage roots; every call is logged, one line of argv each
STAND_IN = """import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.log"), "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
argv = sys.argv[1:]
if argv[:2] == ["container", "exists"]:
    known = json.load(open(os.path.join(here, "taken.json"))) + list(json.load(open(os.path.join(here, "states.json"))))
    sys.exit(0 if argv[2] in known else 1)
if argv[:2] == ["container", "inspect"]:
    states = json.load(open(os.path.join(here, "states.json")))
    if argv[-1] not in states:
        sys.exit(125)
    print(states[argv[-1]])
elif argv[:1] == ["info"]:
    print(os.path.join(here, "storage"))
    print(os.path.join(here, "run"))
"""


@pytest.fixture
def podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in first on PATH, a configuration and trust policy of the test's own; its directory."""
    here = tmp_path / "podman"
    here.mkdir()
    (here / "stand_in.py").write_text(STAND_IN)
    (here / "podman").write_text(f"#!/bin/sh\nexec {sys.executable} {here / 'stand_in.py'} \"$@\"\n")
    (here / "podman").chmod(0o755)
    (here / "taken.json").write_text(json.dumps(["web"]))
    (here / "states.json").write_text(json.dumps({"web": "running", "stopped-web": "exited"}))
    (here / "calls.log").write_text("")
    (here / "storage").mkdir()  # what `info` names, where a pass that goes on stages
    (here / "run").mkdir()
    monkeypatch.setenv("PATH", f"{here}{os.pathsep}{os.environ.get('PATH', os.defpath)}")
    config = tmp_path / "config.toml"
    config.write_text('delegate = "runc"\n')
    monkeypatch.setenv("GPUCKPT_CONFIG", str(config))
    monkeypatch.setenv("GPUCKPT_TRUST_DIR", str(tmp_path / "etc"))
    monkeypatch.setenv("GPUCKPT_TRUST_LOG", str(tmp_path / "log" / "trust.log"))
    return here


def calls(podman: Path) -> list[str]:
    return (podman / "calls.log").read_text().splitlines()


@pytest.mark.skipif(not podman_registration()[0], reason="gpuckpt import refuses first where this node's podman "
                                                         "does not register gpuckpt-runtime (gpuckpt install)")
def test_an_imports_taken_name_is_refused_before_podmans_storage_is_asked(podman, tmp_path, capsys) -> None:
    archive = tmp_path / "archives" / "web.tar"
    archive.parent.mkdir()
    archive.write_bytes(podman43_tar())  # podman's order; config.dump names "web", which the stand-in has
    assert main(["trust", "allow-unsigned", f"archive:{archive.parent}/"]) == 0
    capsys.readouterr()
    assert main(["import", str(archive)]) == 2
    assert capsys.readouterr().err.strip() == ("gpuckpt import: a container with the name web already exists on this "
                                               "node: refused (give --name NEW, or remove it first)")
    made = calls(podman)
    assert "container exists web" in made
    assert not [call for call in made if call.startswith("info")], made  # the slow call never came


@pytest.mark.skipif(not podman_registration()[0], reason="gpuckpt import refuses first where this node's podman "
                                                         "does not register gpuckpt-runtime (gpuckpt install)")
def test_the_head_read_is_bounded_and_the_checking_pass_still_refuses(podman, tmp_path, capsys) -> None:
    """config.dump past the head's 8 MiB (a large /dev/shm before it): the early read gives up, decompressing no
    more, and the checking pass refuses the taken name as it did before, after podman's storage is asked."""
    archive = tmp_path / "archives" / "web.tar"
    archive.parent.mkdir()
    archive.write_bytes(podman43_tar(devshm=bytes(9 << 20)))
    assert main(["trust", "allow-unsigned", f"archive:{archive.parent}/"]) == 0
    capsys.readouterr()
    assert main(["import", str(archive)]) == 2
    assert "a container with the name web already exists on this node: refused" in capsys.readouterr().err
    made = calls(podman)
    asked = [at for at, call in enumerate(made) if call.startswith("info")]
    assert len(asked) == 1 and asked[0] < made.index("container exists web"), made  # one `info`, then the name
    assert not list(podman.glob(".gpuckpt-import-*"))  # the staging the pass began, removed


def test_a_stored_checkpoints_taken_name_is_refused_before_podmans_storage_is_asked(podman, tmp_path,
                                                                                     capsys) -> None:
    root = str(tmp_path / "store")
    with Store(root) as store:
        writer = CheckpointWriter(store, threads=2)
        with store.locked():
            copy_checked(io.BytesIO(podman_tar()), None, "test", observe=writer.observe)
            writer.commit("web-1", "web", "c0ffee" * 10 + "abcd")
    assert main(["store", "restore", "web-1", "--store", root]) == 2
    assert "a container with the name web already exists on this node: refused" in capsys.readouterr().err
    assert not [call for call in calls(podman) if call.startswith("info")], calls(podman)


@pytest.mark.parametrize("argv", [["export", "stopped-web", "-o", "OUT"],
                                  ["store", "checkpoint", "stopped-web", "--store", "STORE"]])
def test_a_stopped_container_is_refused_naming_its_state_and_never_put_back(podman, tmp_path, capsys,
                                                                           argv) -> None:
    argv = [str(tmp_path / "web.tar.zst") if word == "OUT" else str(tmp_path / "store") if word == "STORE"
            else word for word in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "stopped-web is exited, not running: podman checkpoints only a running container" in err
    assert "`podman container restore stopped-web` where it was checkpointed" in err
    made = calls(podman)
    assert not [call for call in made if call.startswith(("container checkpoint", "container restore"))], made
    assert not (tmp_path / "web.tar.zst").exists()


def test_a_container_podman_does_not_know_is_still_not_found(podman, capsys) -> None:
    assert main(["export", "nothere", "-o", "/tmp/unused.tar.zst"]) == 4
    assert "no container 'nothere' in podman" in capsys.readouterr().err
