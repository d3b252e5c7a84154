"""The GPU manifest: what a checkpoint image holds on the GPU side, and how it was made.

Written as `gpuckpt-manifest.json` into the checkpoint image directory, so it
travels wherever the engine moves the image; restore reads it to check the node
and to find and remap the CUDA processes.
"""

from __future__ import annotations

import json
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuckpt.errors import ImageError
from gpuckpt.safefiles import replace_private

MANIFEST_NAME = "gpuckpt-manifest.json"
SCHEMA_VERSION = 1
MAX_MANIFEST_BYTES = 4 << 20


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuRecord(_Record):
    index: int
    uuid: str
    name: str
    memory_total_bytes: int


class CudaProcessRecord(_Record):
    host_pid: int
    container_pid: int
    # Device memory the driver moved to host memory (NVML's figure before the move).
    checkpointed_bytes: int = 0
    gpu_uuids: list[str] = []


class Timings(_Record):
    lock_s: float = 0.0
    device_checkpoint_s: float = 0.0
    dump_s: float = 0.0
    total_s: float = 0.0
    # --leave-running: first lock to last unlock.
    downtime_s: float | None = None


class NetworkPolicy(_Record):
    """What the container's sockets were doing at checkpoint time and what the shim chose."""

    tcp_connected: list[str] = []
    tcp_listening: list[str] = []
    unix_external: int = 0
    file_locks: int = 0
    engine_options: list[str] = []  # passed by the engine itself: respected as they were
    added_options: list[str] = []  # added by the shim; restore adds them again
    network_lock: str = "iptables"
    sockets_unreadable: str = ""  # set when sock_diag could not be read: nothing was added for sockets


class Manifest(_Record):
    kind: Literal["gpuckpt-manifest"] = "gpuckpt-manifest"
    schema_version: int = Field(default=SCHEMA_VERSION)
    created: str
    container_id: str
    driver_version: str = ""
    cuda_driver_version: int = 0
    gpus: list[GpuRecord] = []  # the container's GPUs, in index order
    # Every GPU of the node: the driver may see them all, and a remap must cover each.
    node_gpu_uuids: list[str] = []
    processes: list[CudaProcessRecord] = []
    # What handled the GPU state: this shim, or CRIU's own CUDA plugin.
    gpu_handler: Literal["gpuckpt", "criu-cuda-plugin", "none"] = "gpuckpt"
    delegate: str = ""
    delegate_args: list[str] = []
    leave_running: bool = False
    network: NetworkPolicy = NetworkPolicy()
    criu_config: list[str] = []  # lines of the shim's CRIU config file for the dump
    timings: Timings = Timings()


def write_manifest(image_dir: str, manifest: Manifest) -> str:
    """Write atomically, readable by root only (the image holds process memory anyway)."""
    path = os.path.join(image_dir, MANIFEST_NAME)
    replace_private(path, manifest.model_dump_json(indent=2))
    return path


def read_manifest(image_dir: str) -> Manifest | None:
    """The image's manifest, None if it has none (a checkpoint without GPU state)."""
    path = os.path.join(image_dir, MANIFEST_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ImageError(f"{path}: cannot read: {error.strerror}") from None
    with os.fdopen(fd, "rb") as manifest_file:
        text = manifest_file.read(MAX_MANIFEST_BYTES + 1)
    return parse_manifest(text, path)


def parse_manifest(text: bytes, path: str) -> Manifest:
    """Validate a manifest's bytes; `path` names where they came from in errors."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise ImageError(f"{path}: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ImageError(f"{path}: not valid JSON: {error}") from None
    if isinstance(raw, dict) and raw.get("schema_version") != SCHEMA_VERSION:
        raise ImageError(f"{path}: schema_version {raw.get('schema_version')!r} is not supported "
                         f"(this gpuckpt reads {SCHEMA_VERSION})")
    try:
        return Manifest.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        raise ImageError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
