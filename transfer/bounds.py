"""What one `gpuckpt import` may write before podman restores: the operator's bounds, checked first.

An archive from another node is untrusted until checked, and a few KiB of zstd can claim GiBs.
Two bounds, each checked before the bytes they bound are written (or fallocated):
- `StagingBudget`: every byte staged (the pages files, the rest of the archive for podman) stops
  at the staging filesystem's free space minus `import.reserve_bytes`, and at
  `import.max_staged_bytes`; an entry's declared size is checked against what is left before
  anything is written for it.
- `RatioGuard`: an entry may expand at most `import.max_entry_ratio` times the compressed bytes
  read while it is decompressed (counted at the decompressor's read size, so a small entry
  always passes).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import BinaryIO

from gpuckpt.errors import ImageError
from gpuckpt.node.config import ImportConfig
from gpuckpt.oci.tarstream import Data

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


class RatioGuard:
    """Bounds how far each entry expands: `consumed()` tells the compressed bytes read so far, of
    `total_bytes`. An entry declaring more than the rest of the archive could expand into is
    refused at its header; one that expands too far as it is read, as soon as it does."""

    def __init__(self, path: str, consumed: Callable[[], int], max_ratio: int, read_bytes: int,
                 total_bytes: int | None = None) -> None:
        self.path, self.consumed, self.max_ratio, self.total_bytes = path, consumed, max_ratio, total_bytes
        self.read_bytes = read_bytes  # what the decompressor may have read ahead of the entry
        self.name, self.start, self.out = "", 0, 0

    def _refused(self, what: str) -> ImageError:
        return ImageError(f"{self.path}: {self.name} {what} {self.max_ratio} times its compressed size: refused "
                          "(import.max_entry_ratio; memory that is almost all zeros compresses up to ~30000 times: "
                          "raise it for such a checkpoint from a node you trust)")

    def entry(self, name: str, size: int) -> None:
        self.name, self.start, self.out = name, self.consumed(), 0
        if self.total_bytes is not None and size > self.max_ratio * (self.total_bytes - self.start + self.read_bytes):
            raise self._refused(f"declares {size // MIB} MiB, which would expand more than")

    def moved(self, count: int) -> None:
        self.out += count
        if self.out > self.max_ratio * (self.consumed() - self.start + self.read_bytes):
            raise self._refused("expands more than")
