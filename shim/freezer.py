"""The cgroup freezer of a container: is it frozen, and thawing it for a while.

containerd pauses (freezes) a container before `checkpoint`; a frozen CUDA
process cannot be locked, so the GPU steps run with the cgroup thawed and the
container is frozen again before the dump, as containerd left it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from ..errors import GpuckptError

CGROUP_ROOT = "/sys/fs/cgroup"


class Freezer:
    """One cgroup's freezer, v1 (freezer.state) or v2 (cgroup.freeze)."""

    def __init__(self, directory: str, v2: bool) -> None:
        self.directory, self.v2 = directory, v2

    @classmethod
    def of_process(cls, pid: int, cgroup_root: str = CGROUP_ROOT) -> Freezer | None:
        try:
            with open(f"/proc/{pid}/cgroup") as cgroups:
                lines = cgroups.read().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "freezer" in controllers.split(","):
                return cls(os.path.join(cgroup_root, "freezer", path.lstrip("/")), v2=False)
        for line in lines:
            if line.startswith("0::"):
                directory = os.path.join(cgroup_root, line[3:].lstrip("/"))
                if os.path.exists(os.path.join(directory, "cgroup.freeze")):
                    return cls(directory, v2=True)
        return None

    def _read(self, name: str) -> str:
        with open(os.path.join(self.directory, name)) as control:
            return control.read()

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.directory, name), "w") as control:
            control.write(value)

    def is_frozen(self) -> bool:
        if self.v2:
            return self._read("cgroup.freeze").strip() == "1"
        return self._read("freezer.state").strip() in ("FROZEN", "FREEZING")

    def _settled(self, frozen: bool) -> bool:
        if self.v2:
            return f"frozen {int(frozen)}" in self._read("cgroup.events")
        return self._read("freezer.state").strip() == ("FROZEN" if frozen else "THAWED")

    def set_frozen(self, frozen: bool, timeout_s: float = 10.0) -> None:
        if self.v2:
            self._write("cgroup.freeze", "1" if frozen else "0")
        else:
            self._write("freezer.state", "FROZEN" if frozen else "THAWED")
        deadline = time.monotonic() + timeout_s
        while not self._settled(frozen):
            if time.monotonic() > deadline:
                raise GpuckptError(f"cgroup {self.directory} did not {'freeze' if frozen else 'thaw'} within "
                                   f"{timeout_s:g} s")
            time.sleep(0.005)


@contextlib.contextmanager
def thawed(freezer: Freezer | None) -> Iterator[bool]:
    """Thaw a frozen container for the block and freeze it again after; yields whether it was frozen."""
    if freezer is None or not freezer.is_frozen():
        yield False
        return
    freezer.set_frozen(False)
    try:
        yield True
    finally:
        freezer.set_frozen(True)
