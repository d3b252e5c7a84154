"""The record of a suspended container: which CUDA processes hold their GPU state in host
memory, on which GPUs, since when. Kept root-only in the state directory so it outlives the
CLI; the driver's own per-process state stays the authority.
"""

from __future__ import annotations

import contextlib
import json
import os

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ImageError
from ..host.safefiles import read_bounded, replace_file
from .paths import state_dir

SCHEMA_VERSION = 1
MAX_RECORD_BYTES = 4 << 20  # a few hundred bytes per CUDA process


class SuspendedProcess(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pid: int
    gpu_uuids: list[str] = []
    device_bytes: int = 0


class Suspension(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    container: str
    engine: str  # who suspended it: the CLI's engine name, "pause" (suspend-on-pause) or "standby" (a restore)
    init_pid: int
    since: str
    processes: list[SuspendedProcess]
    suspend_s: float = 0.0
    # A standby restore: the GPUs it will take (the checkpoint's GPU UUID -> this node's), chosen and
    # checked at restore, given to the driver at resume; and the host memory its processes held then.
    gpu_pairs: list[tuple[str, str]] = []
    host_bytes: int = 0


def _directory() -> str:
    return os.path.join(state_dir(), "suspended")


def _path(container: str) -> str:
    if not container or "/" in container or container.startswith("."):
        raise ImageError(f"container name {container!r} cannot name a suspension record")
    return os.path.join(_directory(), f"{container}.json")


def write_suspension(record: Suspension) -> None:
    os.makedirs(_directory(), mode=0o700, exist_ok=True)
    path = _path(record.container)
    replace_file(path, record.model_dump_json(indent=2))


def read_suspension(container: str) -> Suspension | None:
    path = _path(container)
    if not os.path.lexists(path):
        return None
    try:
        raw = json.loads(read_bounded(path, MAX_RECORD_BYTES, f"{path}: suspension record"))
    except ValueError as error:
        raise ImageError(f"{path}: unreadable suspension record: {error}") from None
    try:
        return Suspension.model_validate(raw)
    except ValidationError as error:
        raise ImageError(f"{_path(container)}: {error.errors()[0]['msg']}") from None


def remove_suspension(container: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_path(container))


def all_suspensions() -> list[Suspension]:
    try:
        names = sorted(os.listdir(_directory()))
    except FileNotFoundError:
        return []
    return [record for name in names if name.endswith(".json")
            if (record := read_suspension(name[:-5])) is not None]


def _request_path(container: str) -> str:
    """A standby request: `gpuckpt restore --group` asks the shim's next restore of `container` to leave its
    GPU state in host memory, so that every member of the group is put back on the GPU together."""
    _path(container)  # the same names as a record
    return os.path.join(state_dir(), "standby-requests", container)


def ask_standby_restore(container: str) -> None:
    os.makedirs(os.path.dirname(_request_path(container)), mode=0o700, exist_ok=True)
    replace_file(_request_path(container), "")


def take_standby_request(container: str) -> bool:
    """Whether a standby restore of `container` was asked for; the request is used up."""
    try:
        os.unlink(_request_path(container))
    except FileNotFoundError:
        return False
    return True
