"""`gpuckpt`'s errors name the real cause, one line each, with an exit status a script can tell apart
(cli/exit_codes.py, docs/cli-output.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuckpt.cli.exit_codes import EXIT_CODES, FAILED, exit_status
from gpuckpt.cli.main import build_parser, main
from gpuckpt.errors import (
    CheckpointRefusedError,
    ConfigError,
    DelegateError,
    GpuckptError,
    ImageError,
    NotFoundError,
    NotRootError,
    UsageError,
)
from gpuckpt.host.programs import CommandError
from gpuckpt.policy.annotations import PolicyError
from gpuckpt.trust.signature import SignatureError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli-output.md"
NOBODY = 65534


@pytest.mark.parametrize("error, status", [
    (NotFoundError("x"), 4), (UsageError("x"), 2), (ConfigError("x"), 2), (PolicyError("x"), 3),
    (SignatureError("x"), 3), (ImageError("x"), 3), (CheckpointRefusedError("x"), 3), (CommandError("x", 125), 5),
    (DelegateError("x", 7), 5), (NotRootError("x"), 6), (GpuckptError("x"), FAILED),
])
def test_each_kind_of_error_has_its_status(error: GpuckptError, status: int) -> None:
    assert exit_status(error) == status


def test_the_docs_table_is_the_code_table() -> None:
    """docs/cli-output.md's exit status table lists every status of EXIT_CODES, and no other."""
    text = DOCS.read_text()
    documented = {int(status) for status in re.findall(r"^\| (\d+) +\|", text, re.MULTILINE)}
    assert documented == {0, FAILED, 130} | {row.status for row in EXIT_CODES}


def test_the_runtime_keeps_runcs_statuses() -> None:
    """gpuckpt-runtime exits with the error's own status (runc's 1, or its delegate's), never the table's."""
    assert ImageError("x").exit_status == 1 and DelegateError("x", 7).exit_status == 7


def test_trust_verify_of_a_missing_archive_says_it_does_not_exist(node, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GPUCKPT_TRUST_DIR", str(tmp_path / "trust"))
    missing = tmp_path / "missing.tar.zst"
    assert main(["trust", "verify", str(missing)]) == 4
    assert capsys.readouterr().err == f"gpuckpt trust: {missing}: no such file\n"


def test_inspect_of_a_missing_path_is_not_found(node, tmp_path, capsys) -> None:
    assert main(["inspect", str(tmp_path / "gone.tar.zst")]) == 4
    assert "no such checkpoint archive" in capsys.readouterr().err


def test_a_bad_config_value_is_one_line_with_status_2(node, tmp_path, capsys) -> None:
    """The key, the value and what is allowed; not pydantic's locations (`import.max_staged_bytes.literal['auto']`)."""
    (tmp_path / "config.toml").write_text('[import]\nmax_staged_bytes = "lots"\n')
    assert main(["suspend", "someone", "--engine", "runc", "--root", str(tmp_path / "runc")]) == 2
    err = capsys.readouterr().err
    assert err == (f"gpuckpt suspend: {tmp_path / 'config.toml'}: import.max_staged_bytes = 'lots': should be 'auto' "
                   "or a valid integer\n")


def test_every_command_is_classified_root_or_not(monkeypatch) -> None:
    """Root is needed by every command but inspect (and install with --config FILE, a file of the user's)."""
    from gpuckpt.cli.main import needs_root
    monkeypatch.delenv("GPUCKPT_TRUST_DIR", raising=False)  # the node's own trust directory
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    free = {name for name in commands if not needs_root(parser.parse_args(_minimal(name)))}
    assert free == {"inspect"}
    # pointed at files of the user's own
    assert not needs_root(parser.parse_args(["install", "--engine", "podman", "--config", "/tmp/x.conf"]))
    assert not needs_root(parser.parse_args(["store", "list", "--store", "/tmp/mine"]))
    assert needs_root(parser.parse_args(["store", "checkpoint", "web", "--store", "/tmp/mine"]))  # podman's


def _minimal(command: str) -> list[str]:
    """Enough arguments for argparse to accept `command`."""
    extra = {"suspend": ["c"], "resume": ["c"], "inspect": ["p"], "export": ["c", "-o", "x"], "import": ["a"],
             "trust": ["list"], "store": ["list"], "service": ["status"], "install": ["--engine", "podman"],
             "restore": ["c"], "pool": ["status"], "checkpoint": ["--group", "g"]}
    return [command, *extra.get(command, [])]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="runs gpuckpt as another user: needs root and setpriv")
@pytest.mark.parametrize("argv", [["store", "list"], ["doctor"], ["trust", "list"], ["drain"], ["status"]])
def test_another_user_is_told_must_be_root_once(node, argv: list[str]) -> None:
    """Not a cascade of Permission denied (or doctor's failures that root would not see): one line, status 6."""
    ran = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                          sys.executable, "-m", "gpuckpt.cli.main", *argv],
                         capture_output=True, text=True, timeout=60, cwd="/",
                         env={key: value for key, value in os.environ.items() if key != "GPUCKPT_TRUST_DIR"})
    assert (ran.returncode, ran.stdout, ran.stderr) == (6, "", f"gpuckpt {argv[0]}: must be root (run it with sudo)\n")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="runs gpuckptd as another user: needs root and setpriv")
def test_gpuckptd_as_another_user_says_must_be_root(node) -> None:
    """gpuckptd run by another user ended in PermissionError's traceback (the journal directory): one line."""
    ran = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                          sys.executable, "-m", "gpuckpt.service.main"],
                         capture_output=True, text=True, timeout=60, cwd="/", env=dict(os.environ))
    assert (ran.returncode, ran.stdout, ran.stderr) == (6, "", "gpuckptd: cannot start: must be root (run it with "
                                                                "sudo)\n")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="runs gpuckpt as another user: needs root and setpriv")
def test_an_archive_the_user_cannot_read_is_an_io_error_not_a_refusal(node) -> None:
    """`gpuckpt inspect` of a root-only archive by another user exited 3, "refused" (the operator trial): the
    file's permissions are the reader's lack, not the archive's fault: status 1, the same one line."""
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="gpuckpt-test-perm-", dir="/tmp"))
    try:
        directory.chmod(0o755)
        archive = directory / "root-only.tar.zst"
        archive.write_bytes(b"\x28\xb5\x2f\xfd")  # what an export writes: 0600, root's
        archive.chmod(0o600)
        ran = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                              sys.executable, "-m", "gpuckpt.cli.main", "inspect", str(archive)],
                             capture_output=True, text=True, timeout=60, cwd="/")
        assert (ran.returncode, ran.stderr) == (FAILED, f"gpuckpt inspect: {archive}: cannot read: Permission "
                                                        "denied\n"), ran
    finally:
        shutil.rmtree(directory)


def test_suspend_of_a_cpu_container_says_it_has_no_cuda_process(node, tmp_path, capsys) -> None:
    """Not "libcuda.so.1 not found" (on a node without the driver) or the driver's own words: the container's
    processes hold no NVIDIA device, found before the driver is loaded. Run through a runc stand-in whose
    container is a real CPU process."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    shutil.copy(Path(__file__).with_name("fake_runtime.py"), runtime / "runc")
    (runtime / "runc").chmod(0o755)
    cpu = subprocess.Popen(["sleep", "60"])
    try:
        (runtime / "runtime.json").write_text(json.dumps(
            {"state": {"ociVersion": "1.0.2", "id": "ops-cpu", "pid": cpu.pid, "status": "running", "bundle": "/"},
             "pids": [cpu.pid]}))
        (tmp_path / "config.toml").write_text(f'delegate = "{runtime / "runc"}"\n')
        assert main(["suspend", "ops-cpu", "--engine", "runc", "--root", str(tmp_path / "root")]) == 2
        assert capsys.readouterr().err == ("gpuckpt suspend: container ops-cpu has no CUDA process: nothing to suspend "
                                           "(suspend frees the GPU memory of a container's CUDA processes)\n")
    finally:
        cpu.kill()
        cpu.wait()
