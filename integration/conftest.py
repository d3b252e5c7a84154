"""Integration fixtures: real engines, real runc/crun/CRIU, root only.

The test bed comes from integration/testbed/setup.sh; a missing part is an error
here, not a skip, so a broken install cannot pass unnoticed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # bed.py, the helpers
from bed import CONFIG  # noqa: E402


@pytest.fixture(params=["runc", "crun"])
def delegate(request) -> Iterator[str]:
    """Run the test with /etc/gpuckpt/config.toml naming this delegate; the old file comes back after."""
    if os.geteuid() != 0:
        pytest.fail("integration tests need root (run them through integration/test.sh)")
    saved = CONFIG.read_text() if CONFIG.exists() else None
    CONFIG.parent.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(f'delegate = "{request.param}"\n')
    CONFIG.chmod(0o644)
    try:
        yield request.param
    finally:
        if saved is None:
            CONFIG.unlink()
        else:
            CONFIG.write_text(saved)
