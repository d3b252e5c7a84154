"""The GPU manifest: what a checkpoint image holds on the GPU side, and how it was made.

Written as `gpuckpt-manifest.json` into the checkpoint image directory, so it
travels wherever the engine moves the image; restore reads it to check the node
and to find and remap the CUDA processes.
"""

from __future__ import annotations

import json
import os
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ..errors import ImageError
from ..host.safefiles import read_regular, replace_file
from .problems import first_problem

MANIFEST_NAME = "gpuckpt-manifest.json"
SCHEMA_VERSION = 1
MAX_MANIFEST_BYTES = 4 << 20

# A manifest comes with an image from wherever the image came from: every field that could
# reach a command line, a config line, a path or a terminal is allow-listed or bounded here,
# so every reader gets the same checks.
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT
MAX_BYTES = 1 << 50  # any GPU's or process's device memory, with room
MAX_ITEMS = 4096
MAX_SECONDS = 1e7
# The three options the shim adds to a dump and again to the restore (policy/network.py).
NetworkOption = Literal["--tcp-established", "--ext-unix-sk", "--file-locks"]
GpuUuid = Annotated[str, StringConstraints(pattern=r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                                                   r"[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")]
Pid = Annotated[int, Field(ge=1, le=PID_MAX)]
Count = Annotated[int, Field(ge=0, le=1 << 20)]
Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]


def _printable(text: str) -> str:
    """No control characters: these strings are printed by `gpuckpt inspect` and in logs."""
    if any(ord(char) < 0x20 or 0x7f <= ord(char) < 0xa0 for char in text):
        raise ValueError("holds control characters")
    return text


# Printable text of a bounded length (one alias per bound: a type checker reads no call here).
Name = Annotated[str, StringConstraints(max_length=96), AfterValidator(_printable)]
Address = Annotated[str, StringConstraints(max_length=160), AfterValidator(_printable)]
Message = Annotated[str, StringConstraints(max_length=1024), AfterValidator(_printable)]
PathText = Annotated[str, StringConstraints(max_length=4096), AfterValidator(_printable)]


CRIU_CONFIG_LINE = re.compile(r"^(ghost-limit [1-9][0-9]{0,15}|network-lock (iptables|nftables)|link-remap)$")


def _criu_config_line(line: str) -> str:
    """Only the lines the shim writes (shim/criuconf.py): ghost-limit N, network-lock X, link-remap."""
    if not CRIU_CONFIG_LINE.match(line) or (line.startswith("ghost-limit") and int(line.split()[1]) > MAX_BYTES):
        raise ValueError("allowed lines: 'ghost-limit N' (bytes), 'network-lock iptables|nftables', 'link-remap'")
    return line


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuRecord(_Record):
    index: Annotated[int, Field(ge=0, le=1023)]
    uuid: GpuUuid
    name: Name
    memory_total_bytes: Bytes


class CudaProcessRecord(_Record):
    host_pid: Pid
    container_pid: Pid
    # Device memory the driver moved to host memory (NVML's figure before the move).
    checkpointed_bytes: Bytes = 0
    gpu_uuids: Annotated[list[GpuUuid], Field(max_length=64)] = []


class DriverFileRecord(_Record):
    """An NVIDIA driver library the container's processes mapped when they were dumped: CRIU maps it again by
    this path at the restore, and the process keeps using the driver of this version (docs/cdi.md)."""

    path: PathText  # as the processes map it: the path inside the container
    version: Annotated[str, StringConstraints(pattern=r"^\d{3}\.\d{1,3}(\.\d{1,3})?$")]  # from its name
    # The host file the container's config bind-mounted there (a CDI spec's hostPath); "" where the file was
    # the image's own (a CUDA forward-compatibility libcuda), which travels with the image, or a hook mounted it
    host_path: PathText = ""


class Timings(_Record):
    lock_s: Seconds = 0.0
    device_checkpoint_s: Seconds = 0.0
    dump_s: Seconds = 0.0
    total_s: Seconds = 0.0
    # --leave-running: first lock to last unlock.
    downtime_s: Seconds | None = None


class NetworkPolicy(_Record):
    """What the container's sockets were doing at checkpoint time and what the shim chose."""

    tcp_connected: Annotated[list[Address], Field(max_length=MAX_ITEMS)] = []
    tcp_listening: Annotated[list[Address], Field(max_length=MAX_ITEMS)] = []
    unix_external: Count = 0
    file_locks: Count = 0
    engine_options: Annotated[list[NetworkOption], Field(max_length=3)] = []  # passed by the engine: as they were
    # added by the shim; restore adds them again
    added_options: Annotated[list[NetworkOption], Field(max_length=3)] = []
    network_lock: Literal["iptables", "nftables"] = "iptables"
    sockets_unreadable: Message = ""  # set when sock_diag could not be read: nothing was added for sockets


class SpecGrants(_Record):
    """What the checkpointed container's spec gave it that a restore spec could widen, kept in the signed manifest:
    its hooks ("STAGE PATH #DIGEST"), its capabilities, its device nodes and cgroup device rules (those runc,
    the node's NVIDIA devices and the operator's allow-list do not already give: a restore may give other
    GPUs). A restore spec comes from outside the dump (podman's own --import takes spec.dump as the archive
    carries it)."""
    hooks: Annotated[list[PathText], Field(max_length=256)] = []
    capabilities: Annotated[list[Annotated[str, StringConstraints(pattern=r"^CAP_[A-Z_]{1,40}$")]],
                            Field(max_length=128)] = []
    # device nodes and cgroup allow rules beyond runc's defaults, this node's NVIDIA devices and the operator's
    # allow-list (policy/devices.py's words: "/dev/fuse (c 10:229)", "cgroup rule allow c 10:229 rwm")
    devices: Annotated[list[PathText], Field(max_length=MAX_ITEMS)] = []
    device_rules: Annotated[list[PathText], Field(max_length=MAX_ITEMS)] = []
    # bind mounts, "DESTINATION <- SOURCE ro|rw", the container's own directory in its engine's storage as <self>
    binds: Annotated[list[PathText], Field(max_length=MAX_ITEMS)] = []


class Manifest(_Record):
    kind: Literal["gpuckpt-manifest"] = "gpuckpt-manifest"
    schema_version: int = Field(default=SCHEMA_VERSION)
    created: Annotated[str, StringConstraints(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")]
    # runc's rule for a container ID (podman's are 64 hex digits).
    container_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_+.-]{0,1023}$")]
    driver_version: Annotated[str, StringConstraints(pattern=r"^(\d{1,5}(\.\d{1,5}){0,3})?$")] = ""
    cuda_driver_version: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    gpus: Annotated[list[GpuRecord], Field(max_length=64)] = []  # the container's GPUs, in index order
    # Every GPU of the node: the driver may see them all, and a remap must cover each.
    node_gpu_uuids: Annotated[list[GpuUuid], Field(max_length=64)] = []
    processes: Annotated[list[CudaProcessRecord], Field(max_length=MAX_ITEMS)] = []
    # What handled the GPU state: this shim, or CRIU's own CUDA plugin.
    gpu_handler: Literal["gpuckpt", "none"] = "gpuckpt"
    delegate: PathText = ""
    delegate_args: Annotated[list[PathText], Field(max_length=1024)] = []  # recorded, never run again
    leave_running: bool = False
    network: NetworkPolicy = NetworkPolicy()
    # lines of the shim's CRIU config file for the dump
    criu_config: Annotated[list[Annotated[str, StringConstraints(max_length=64), AfterValidator(_criu_config_line)]],
                           Field(max_length=8)] = []
    timings: Timings = Timings()
    # Written false before the dump and true once it succeeded, so an image whose dump (or whose
    # final write) never finished is refused rather than restored with its processes locked. A
    # manifest without the field comes from a gpuckpt that wrote it only after a successful dump.
    dump_completed: bool = True
    # A lazy dump (--lazy-pages): true once every image but the memory pages is written and CRIU's page
    # server is ready; the pages stay with the source until a lazy restore has taken them all. With
    # dump_completed false that is "lazy, completing": only a lazy restore can take the image then.
    lazy_pages: bool = False
    # The driver libraries the processes mapped (oci/nvidia_paths.py), from /proc before the dump. A manifest
    # without the field (a gpuckpt before it, or nothing mapped) is judged by cuda.driver_version_policy alone.
    driver_files: Annotated[list[DriverFileRecord], Field(max_length=MAX_ITEMS)] = []
    # What the spec granted at the checkpoint (policy/spec_grants.py); None: a gpuckpt before it
    spec_grants: SpecGrants | None = None


DUMP_INCOMPLETE, DUMP_LAZY_COMPLETING, DUMP_COMPLETED = "incomplete", "lazy, completing", "completed"


def dump_state(manifest: Manifest) -> str:
    """The dump as its manifest says: completed, "lazy, completing" (a lazy restore may begin), or incomplete."""
    if manifest.dump_completed:
        return DUMP_COMPLETED
    return DUMP_LAZY_COMPLETING if manifest.lazy_pages else DUMP_INCOMPLETE


def write_manifest(image_dir: str, manifest: Manifest) -> str:
    """Write atomically, readable by root only (the image holds process memory anyway)."""
    path = os.path.join(image_dir, MANIFEST_NAME)
    # lazy_pages, driver_files and spec_grants left out unless set: a gpuckpt before them reads every other manifest
    unset = {name for name in ("lazy_pages", "driver_files", "spec_grants") if not getattr(manifest, name)}
    replace_file(path, manifest.model_dump_json(indent=2, exclude=unset or None))
    return path


def require_completed(manifest: Manifest, image_dir: str, *, lazy_restore: bool = False) -> None:
    """Refuse an image whose dump never completed (its CUDA processes would stay locked); a lazy dump still
    completing is accepted by a lazy restore (`lazy_restore`: --lazy-pages), which takes the pages from it."""
    state = dump_state(manifest)
    if state == DUMP_LAZY_COMPLETING and not lazy_restore:
        raise ImageError(f"{os.path.join(image_dir, MANIFEST_NAME)}: the dump of {manifest.container_id} is lazy, "
                         "completing (its memory pages are still served by CRIU's page server): only a restore "
                         "with --lazy-pages can take it until the dump completes")
    if state == DUMP_INCOMPLETE:
        raise ImageError(f"{os.path.join(image_dir, MANIFEST_NAME)}: the dump of {manifest.container_id} never "
                         "completed (the checkpoint failed or was cut short): this image cannot be restored")


def read_manifest(image_dir: str) -> Manifest | None:
    """The image's manifest, None if it has none (a checkpoint without GPU state)."""
    path = os.path.join(image_dir, MANIFEST_NAME)
    try:
        # O_NONBLOCK: a FIFO by that name must not hang the caller (refused as not a regular file)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ImageError(f"{path}: cannot read: {error.strerror}") from None
    return parse_manifest(read_regular(fd, MAX_MANIFEST_BYTES, path), path)


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
        raise ImageError(f"{path}: {first_problem(error)}") from None
