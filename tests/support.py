"""Helpers shared by the unit tests."""

from __future__ import annotations

import os
from pathlib import Path


def write_config(node: Path, text: str) -> Path:
    path = node / "config.toml"
    path.write_text(text)
    os.chmod(path, 0o644)
    return path
