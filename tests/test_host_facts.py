"""podman's node annotations of a checkpoint image, asked of this node (host/facts.py)."""

from __future__ import annotations

import os
import stat

from gpuckpt.host import facts as host_facts
from gpuckpt.host.facts import KEY, checkpoint_host_annotations


def test_the_keys_are_podmans_and_a_runtime_name_from_data_is_never_run(tmp_path, monkeypatch) -> None:
    planted = tmp_path / "evil"
    planted.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\necho evil\n")
    planted.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    found = checkpoint_host_annotations(str(planted))
    assert found[f"{KEY}.runtime.version"] == "" and not (tmp_path / "ran").exists()
    assert checkpoint_host_annotations("evil")[f"{KEY}.runtime.version"] == "" and not (tmp_path / "ran").exists()
    assert set(found) == {f"{KEY}.{name}" for name in (
        "cgroups.version", "conmon.version", "criu.version", "distribution.name", "distribution.version",
        "podman.version", "runtime.version")} | set(host_facts.BASE_ANNOTATIONS)
    assert found[f"{KEY}.cgroups.version"] in ("v1", "v2")


def test_criu_version_is_podmans_number(tmp_path, monkeypatch) -> None:
    criu = tmp_path / "criu"
    criu.write_text("#!/bin/sh\necho 'Version: 4.2.1'\n")
    criu.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert checkpoint_host_annotations("runc")[f"{KEY}.criu.version"] == "40201"


def test_a_program_in_the_working_directory_is_never_run_for_an_empty_path_entry(tmp_path, monkeypatch) -> None:
    """Root's export run in a directory others write to: PATH's empty entry or '.' is not that directory
    (Go's exec.LookPath, which podman and runc use, refuses it too)."""
    criu = tmp_path / "criu"
    criu.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\necho 'Version: 4.2.1'\n")
    criu.chmod(stat.S_IRWXU)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", ":.:/nonexistent")
    assert checkpoint_host_annotations("runc")[f"{KEY}.criu.version"] == "" and not (tmp_path / "ran").exists()
