"""What one `gpuckpt import` may write before podman restores: the operator's bounds, checked first.

An archive from another node is untrusted until checked, and a few KiB of zstd can claim GiBs.
Two bounds, each checked before the bytes they bound are written (or fallocated):
- `StagingBudget`: every byte staged (the pages files, the rest of the archive for podman) stops
  at the staging filesystem's free space minus `import.reserve_bytes`, and at
  `import.max_staged_bytes`; an entry's declared size is checked against what is left before
  anything is written for it.
- `RatioGuard` (oci/archive.py): an entry may expand at most `import.max_entry_ratio` times the compressed bytes
  read while it is decompressed (counted at the decompressor's read size, so a small entry
  always passes).
"""

from __future__ import annotations

import os
from typing import BinaryIO

from ..errors import ImageError
from ..node.config import ImportConfig
from ..oci.tarstream import Data

MIB = 1 << 20


def node_memory_bytes() -> int:
    """This node's memory and swap: the most a checkpoint restored here can hold in pages."""
    total = 0
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            key, _, value = line.partition(":")
            if key in ("MemTotal", "SwapTotal"):
                total += int(value.split()[0]) * 1024
    return total


class StagingBudget:
    """The bytes one import may still stage on one filesystem."""

    def __init__(self, path: str, directory: str, limits: ImportConfig) -> None:
        status = os.statvfs(directory)
        free = status.f_bavail * status.f_frsize
        cap = node_memory_bytes() if limits.max_staged_bytes == "auto" else limits.max_staged_bytes
        self.path, self.left = path, max(0, min(cap, free - limits.reserve_bytes))
        auto = " (auto: memory and swap)" if limits.max_staged_bytes == "auto" else ""
        self.why = (f"import.max_staged_bytes {cap // MIB} MiB{auto}, {free // MIB} MiB free on {directory} "
                    f"less import.reserve_bytes {limits.reserve_bytes // MIB} MiB")

    def take(self, name: str, size: int) -> None:
        """Count `size` more bytes for `name`; an ImageError, before any is written, past the bound."""
        if size > self.left:
            raise ImageError(f"{self.path}: {name} needs {-(-size // MIB)} MiB of staging, more than this import may "
                             f"still stage ({self.left // MIB} MiB: {self.why}): refused")
        self.left -= size


class StagedFile:
    """A stream to disk that takes every byte from the budget before writing it."""

    def __init__(self, out: BinaryIO, budget: StagingBudget, name: str) -> None:
        self.out, self.budget, self.name = out, budget, name

    def write(self, data: Data) -> int:
        self.budget.take(self.name, len(data))
        return self.out.write(data)
