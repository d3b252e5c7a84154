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


# docker (containerd 1.6) with plain crun 1.21 cannot checkpoint/restore; through the shim it
# can: the shim creates containerd's missing --work-path, says "does not exist" for a container
# the dump removed, and drops runc's -no-subreaper (see shim/argv.py, shim/delete.py).
@pytest.fixture(params=["runc", "crun"])
def docker_delegate(request) -> Iterator[str]:
    with configured_delegate(request.param) as name:
        yield name


@pytest.fixture
def runc_delegate() -> Iterator[str]:
    """For tests of what surrounds the runtime (archives, images): one delegate is enough."""
    with configured_delegate("runc") as name:
        yield name
