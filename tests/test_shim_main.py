"""The shim's entry point: pass-through, owned verbs, errors as runc reports them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import write_config

SHIM = [sys.executable, "-m", "gpuckpt.shim.main"]


def run_shim(argv: list[str], env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([*SHIM, *argv], capture_output=True, text=True, env=env, timeout=30)


def recorded(runtime: Path) -> list[str]:
    return (runtime.parent / "argv").read_text().splitlines()


@pytest.mark.parametrize("argv", [
    ["--root", "/run/r", "state", "c1"],
    ["--log", "/x", "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "/p", "c1"],
    ["--unknown-global", "v", "state", "c1"],
    ["exec", "--no-such-flag", "c1", "sh"],
    ["--root", "/run/r", "pause", "c1"],  # not opted in to suspend-on-pause: the delegate's
    ["resume", "c1"],
])
def test_pass_through_keeps_argv_unchanged(node, recording_runtime, argv) -> None:
    write_config(node, f'delegate = "{recording_runtime}"\n')
    result = run_shim(argv)
    assert result.returncode == 0, result.stderr
    assert recorded(recording_runtime) == argv


@pytest.mark.parametrize("verb", ["checkpoint", "restore"])
def test_owned_verbs_pass_the_delegates_status(node, recording_runtime, verb, tmp_path) -> None:
    write_config(node, f'delegate = "{recording_runtime}"\n')
    (tmp_path / "i").mkdir()  # a restore from a directory not there is refused before the delegate runs
    argv = ["--root", "/r", verb, "--image-path", str(tmp_path / "i"), "c1"]
    result = run_shim(argv, {"REC_STATUS": "3"})
    assert result.returncode == 3
    assert recorded(recording_runtime) == argv


def test_delegate_found_on_path_and_cached(node, recording_runtime) -> None:
    path_env = f"{recording_runtime.parent}:{os.environ['PATH']}"
    assert run_shim(["state", "c"], {"PATH": path_env}).returncode == 0
    [cache] = (node / "state").glob("delegate.cache.*")
    assert cache.read_text().split("\0")[-2:] == [str(recording_runtime), ""]  # the delegate; no hook to add
    assert oct(cache.stat().st_mode & 0o777) == "0o600"
    # A config change invalidates the cache: the new (broken) delegate is reported.
    write_config(node, 'delegate = "/nonexistent/crun"\n')
    result = run_shim(["state", "c"], {"PATH": path_env})
    assert result.returncode == 1
    assert "delegate runtime /nonexistent/crun is not an executable file" in result.stderr
    assert str(node / "config.toml") in result.stderr


def test_each_path_the_engines_call_with_keeps_its_cached_delegate(node, recording_runtime) -> None:
    """podman and conmon call the runtime with PATHs of their own: one cache entry for both made each call
    load and check the config again (pydantic, ~200 ms of every delete and restore)."""
    write_config(node, f'delegate = "{recording_runtime}"\n')
    paths = [f"{recording_runtime.parent}:{os.environ['PATH']}", f"{recording_runtime.parent}:/usr/bin:/bin"]
    for path_env in paths:
        assert run_shim(["state", "c"], {"PATH": path_env}).returncode == 0
    for path_env in paths:
        result = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuckpt.shim.main", "state", "c"],
                                capture_output=True, text=True, timeout=30, env={**os.environ, "PATH": path_env})
        assert result.returncode == 0, result.stderr
        assert "gpuckpt.node.config" not in result.stderr  # a cache hit: the config not read again
    write_config(node, f'delegate = "{recording_runtime}"\n# changed\n')
    for path_env in paths:
        assert run_shim(["state", "c"], {"PATH": path_env}).returncode == 0
    assert len(list((node / "state").glob("delegate.cache.*"))) == 2  # a changed config replaced, added nothing


def test_missing_delegate_is_one_line_json_log(node) -> None:
    write_config(node, 'delegate = "no-such-runtime"\n')
    log = node / "runtime.log"
    result = run_shim(["--log", str(log), "--log-format", "json", "state", "c"])
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    entry = json.loads(log.read_text())
    assert entry["level"] == "error" and "'no-such-runtime' not found on PATH" in entry["msg"]
    assert set(entry) == {"level", "msg", "time"}


def test_broken_config_names_the_file(node) -> None:
    path = write_config(node, "delegate = 3\n")
    result = run_shim(["state", "c"])
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}: delegate = 3: should be a valid string")


def test_version_names_shim_and_delegate(node, recording_runtime) -> None:
    recording_runtime.write_text('#!/bin/sh\necho "runc version 9.9"\n')
    write_config(node, f'delegate = "{recording_runtime}"\n')
    result = run_shim(["--version"])
    assert result.returncode == 0
    assert result.stdout.startswith("gpuckpt-runtime version ") and "runc version 9.9" in result.stdout


def test_delete_of_a_container_the_delegate_no_longer_has_says_does_not_exist(node, recording_runtime) -> None:
    """containerd ignores a failed delete only if the runtime says "does not exist" (runc's words)."""
    write_config(node, f'delegate = "{recording_runtime}"\n')
    result = run_shim(["--root", "/r", "delete", "gone"], {"REC_STATUS": "1"})
    assert result.returncode == 1
    assert "container gone does not exist" in result.stderr


def test_delete_passes_the_delegates_success_through(node, recording_runtime) -> None:
    write_config(node, f'delegate = "{recording_runtime}"\n')
    result = run_shim(["delete", "--force", "c1"])
    assert result.returncode == 0 and result.stderr == ""
    assert recorded(recording_runtime) == ["delete", "--force", "c1"]


@pytest.mark.parametrize("argv", [["checkpoint", "--help"], ["restore", "-h"], ["--root", "/r", "checkpoint"],
                                  ["delete", "--help"]])
def test_an_owned_verbs_help_is_the_delegates_without_the_verbs_machinery(node, recording_runtime, argv) -> None:
    """podman asks `checkpoint --help` before each checkpoint and restore: it cost 660 ms when the shim loaded
    the checkpoint verb for it."""
    write_config(node, f'delegate = "{recording_runtime}"\n')
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuckpt.shim.main", *argv],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert recorded(recording_runtime) == argv
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "import time:" in line]
    assert "gpuckpt.shim.argv" in imported  # the table is the shim's (-X importtime)
    assert not {"gpuckpt.shim.checkpoint", "gpuckpt.shim.restore", "gpuckpt.shim.delete"} & set(imported)


def test_delete_which_ends_every_container_loads_no_model_machinery(node, recording_runtime) -> None:
    """Every container's end goes through `delete`: it took 250 ms when its lock came with the journal's
    pydantic models."""
    write_config(node, f'delegate = "{recording_runtime}"\n')
    assert run_shim(["delete", "--force", "c0"]).returncode == 0  # the config read and cached (shim/resolve.py)
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuckpt.shim.main", "delete", "--force", "c1"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "import time:" in line]
    assert "gpuckpt.shim.delete" in imported
    assert not {"pydantic", "gpuckpt.node.journal", "cryptography"} & set(imported)


def test_a_checkpoint_behind_a_global_option_the_shim_does_not_know_is_refused(node, recording_runtime) -> None:
    write_config(node, f'delegate = "{recording_runtime}"\n')
    result = run_shim(["--cgroup-m=systemd", "checkpoint", "--image-path", "/i", "c1"])
    assert result.returncode != 0 and "'--cgroup-m=systemd' is not one it knows" in result.stderr
    assert not (recording_runtime.parent / "argv").exists()
