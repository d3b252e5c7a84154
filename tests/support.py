"""Helpers shared by the unit tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def write_config(node: Path, text: str) -> Path:
    path = node / "config.toml"
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


def build_launcher(where: Path, site: str) -> tuple[Path, Path]:
    """The compiled launcher (shim/resident/build.sh) with a stand-in interpreter that notes each call in the
    returned file, then runs ours (its site-packages on: -I without -S, for pydantic; the launcher's -c code
    puts `site` first)."""
    python = where / "python3"
    python.write_text(f'#!/bin/sh\necho python >> "{where}/python.calls"\n[ "$1" = -IS ] && shift\n'
                      f'exec {sys.executable} -I "$@"\n')
    python.chmod(0o755)
    built = where / "gpuckpt-runtime"
    subprocess.run(["bash", str(REPO / "shim" / "resident" / "build.sh"), str(built), str(python), site], check=True)
    return built, where / "python.calls"


def python_calls(calls: Path) -> int:
    """How often a launcher of build_launcher's started its interpreter."""
    return len(calls.read_text().splitlines()) if calls.exists() else 0


@contextlib.contextmanager
def ready_children() -> Iterator[Callable[..., int]]:
    """start(source, *args): a Python child running `source`, once it printed "ready"; its PID. Each is
    killed and reaped as the block ends."""
    children: list[subprocess.Popen[str]] = []

    def start(source: str, *args: str) -> int:
        child = subprocess.Popen([sys.executable, "-c", source, *args], stdout=subprocess.PIPE, text=True)
        children.append(child)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        return child.pid

    try:
        yield start
    finally:
        for child in children:
            child.kill()
            child.wait()
