"""`gpuckpt import` killed by SIGTERM or SIGHUP unwinds as Ctrl-C does (what it staged goes), once podman is done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A stand-in for the import's staging: a directory made, removed in `finally`, and a wait in between.
CHILD = """
import os, sys, time
from gpuckpt.cli import main as cli
staging, ready = sys.argv[1], sys.argv[2]
def handler(options):
    os.mkdir(staging)
    try:
        open(ready, "w").close()
        time.sleep(60)
    finally:
        os.rmdir(staging)
    return 0
parser = cli.build_parser
def build():
    built = parser()
    for action in built._subparsers._group_actions:
        for name, sub in action.choices.items():
            sub.set_defaults(handler=handler)
    return built
cli.build_parser = build
sys.exit(cli.main([sys.argv[3], "archive.tar"] + sys.argv[4:]))
"""


@pytest.mark.parametrize(("command", "signum"), [("import", signal.SIGTERM), ("import", signal.SIGHUP)])
def test_a_terminated_command_runs_its_cleanup(tmp_path: Path, command: str, signum: int) -> None:
    staging, ready = tmp_path / "staging", tmp_path / "ready"
    extra = ["-o", str(tmp_path / "out.tar")] if command == "export" else []
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(staging), str(ready), command, *extra],
                             env=dict(os.environ))
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert child.poll() is None and time.monotonic() < deadline, "the command did not start"
        time.sleep(0.05)
    assert staging.is_dir()
    child.send_signal(signum)
    assert child.wait(30) == 128 + signum
    assert not staging.exists()


def test_a_termination_while_podman_works_waits_for_it(tmp_path: Path) -> None:
    """podman killed mid-restore could leave its container half made: the signal takes effect after it ends."""
    done = tmp_path / "podman-done"
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from gpuckpt.cli.signals import Terminated, termination_deferred, unwind_at_termination\n"
        "from gpuckpt.host.process import run\n"
        "unwind_at_termination()\n"
        "try:\n"
        "    with termination_deferred():\n"
        f"        print('working', flush=True); run(['sh', '-c', 'sleep 1; touch {done}'])\n"
        "    sys.exit(0)\n"
        "except Terminated as terminated:\n"
        "    sys.exit(128 + terminated.signum)\n")], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "working"
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == 128 + signal.SIGTERM
    assert done.exists()  # the program ran to its end first
