"""Integration fixtures: real engines, real runc/crun/CRIU, root only.

The test bed comes from integration/testbed/setup.sh; a missing part is an error
here, not a skip, so a broken install cannot pass unnoticed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # bed.py, the helpers
from bed import CONFIG  # noqa: E402


@contextlib.contextmanager
def configured_delegate(name: str) -> Iterator[str]:
    """/etc/gpuckpt/config.toml names this delegate for the block; the old file comes back after."""
    if os.geteuid() != 0:
        pytest.fail("integration tests need root (run them through integration/test.sh)")
    saved = CONFIG.read_text() if CONFIG.exists() else None
    CONFIG.parent.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(f'delegate = "{name}"\n')
    CONFIG.chmod(0o644)
    try:
        yield name
    finally:
        if saved is None:
            CONFIG.unlink()
        else:
            CONFIG.write_text(saved)


@pytest.fixture(params=["runc", "crun"])
def delegate(request) -> Iterator[str]:
    with configured_delegate(request.param) as name:
        yield name


# docker (containerd 1.6) with crun cannot checkpoint/restore, shim or not: plain crun 1.21
# fails on containerd's missing --work-path (the shim creates it, as runc does), and the
# restore then fails in containerd with "id already in use" (its task is still "running").
@pytest.fixture(params=["runc"])
def docker_delegate(request) -> Iterator[str]:
    with configured_delegate(request.param) as name:
        yield name
