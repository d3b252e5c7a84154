"""The node configuration, /etc/gpuckpt/config.toml: model, defaults and loader.

Every key is validated; an unknown key or a bad value is a ConfigError naming
the file, the key and what is allowed. No file means the defaults.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable
from typing import Annotated, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from ..errors import ConfigError
from .paths import config_path

ModelT = TypeVar("ModelT", bound=BaseModel)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CudaConfig(_Section):
    # Lock waits for the process's CUDA calls in flight; a stuck kernel must not hang the engine.
    lock_timeout_ms: int = Field(default=10_000, ge=1, le=600_000)
    # Restore on a node whose driver differs: "equal" refuses any difference,
    # "same-major" accepts another release of the same branch (580.x -> 580.y).
    driver_version_policy: Literal["equal", "same-major"] = "same-major"
    # Allow checkpointing processes the driver is known not to restore (NCCL with P2P/cuMem):
    # true for every container; false only for containers annotated
    # io.gpuckpt.allow-unrestorable=true; "never" for none (the annotation is then refused).
    allow_unrestorable: Literal[False, True, "never"] = False
    # "always": transparent hugepages node-wide while GPU state moves (H100: checkpoint 1.5x, restore
    # 1.6x, suspend 2.2x faster; README: Host memory policy); "leave": never touch the node's setting.
    host_hugepages: Literal["leave", "always"] = "always"

    @property
    def wants_hugepages(self) -> bool:
        return self.host_hugepages == "always"
    # --leave-running: dump into /dev/shm while the CUDA processes are locked and move the images to
    # the engine's directory after they run again, when the container fits with memory to spare. Off:
    # on the H100 (128 GiB) the page cache took a 16 GiB dump as fast as /dev/shm (docs/speed.md).
    stage_leave_running: bool = False
    # Suspend every GPU container's CUDA processes on `pause` (else only those annotated
    # io.gpuckpt.suspend-on-pause=true).
    suspend_on_pause: bool = False
    # Honour the annotation io.gpuckpt.restore=standby (a restore that leaves the CUDA processes'
    # state in host memory until `gpuckpt resume`). Whoever made the container or the archive
    # sets annotations, and a standby holds host memory until resumed: off unless the operator
    # allows it (gpuckpt restore --standby, run by root, needs no annotation).
    standby_annotation: bool = False


class CriuConfig(_Section):
    # runc honours a container's `org.criu.config` annotation: a CRIU config file chosen by
    # whoever made the container. CRIU's configuration is the operator's, so it is refused
    # unless the operator allows it here.
    allow_container_config: bool = False
    # Where such a file may be, when allowed (in or below; each directory on the way root-owned
    # and writable by root only or sticky, the file regular, root-owned, writable by root only).
    container_config_dirs: tuple[str, ...] = ("/etc/criu",)

    @field_validator("container_config_dirs")
    @classmethod
    def _dirs_are_absolute(cls, dirs: tuple[str, ...]) -> tuple[str, ...]:
        for directory in dirs:
            if not directory.startswith("/") or os.path.normpath(directory) != directory or directory == "/":
                raise ValueError(f"{directory!r} is not an absolute, normalised directory other than /")
        return dirs

    # Options added to a checkpoint from what the container's sockets and locks are doing:
    # "auto" adds them when needed, "always"/"never" as said. The engine's own are kept.
    tcp_established: Literal["auto", "always", "never"] = "auto"
    ext_unix_sk: Literal["auto", "never"] = "auto"
    file_locks: Literal["auto", "never"] = "auto"
    # How CRIU locks the network during a dump with TCP connections.
    network_lock: Literal["iptables", "nftables"] = "iptables"
    # CRIU copies files that are deleted but still open or mapped ("ghost files") into the
    # image, and refuses any above 1 MiB by default; NCCL's shared-memory transport keeps
    # tens of MiB so. "auto" raises the limit to the container's largest such file, up to
    # max_ghost_bytes (a larger one refuses the checkpoint before anything is frozen: every byte
    # lands in the image, which the restoring node writes back); a number of bytes sets it
    # (0: CRIU's default).
    ghost_limit: Literal["auto"] | Annotated[int, Field(ge=0)] = "auto"
    max_ghost_bytes: int = Field(default=512 << 20, ge=1 << 20, le=1 << 40)
    # A file held under a name since removed while still linked elsewhere (a POSIX named
    # semaphore: multiprocessing's locks with the "spawn" start method) needs CRIU's
    # link-remap, which links it under a temporary name for the dump. "auto" allows that for
    # such files in /dev/shm only (the container's own tmpfs); "never" leaves CRIU to refuse.
    link_remap: Literal["auto", "never"] = "auto"
    # A dump to a page server (--page-server) or for a lazy restore (--lazy-pages) waits for its
    # peer: past this many seconds without the dump ending, the checkpoint is ended (runc and
    # criu killed) and the container keeps running, as runc's ends once the restore side fails.
    peer_timeout_s: int = Field(default=300, ge=1, le=86_400)
    # Any other dump may run this long before it is ended the same way: "auto" gives 300 s plus
    # 1 s per 10 MiB the container's processes hold when it starts (a disk 10 MiB/s slow
    # still completes), so a dump stuck on something else never holds the container for ever.
    dump_timeout_s: Literal["auto"] | Annotated[int, Field(ge=1, le=604_800)] = "auto"


class ImportConfig(_Section):
    # What one `gpuckpt import` may write to disk before podman restores (an archive from
    # another node is untrusted until checked): staged bytes stop at the staging filesystem's
    # free space minus `reserve_bytes`, and at `max_staged_bytes` ("auto": this node's memory
    # and swap, the most a checkpoint restored here can hold in pages).
    max_staged_bytes: Literal["auto"] | Annotated[int, Field(ge=0)] = "auto"
    reserve_bytes: int = Field(default=1 << 30, ge=0)
    # An entry may expand at most this many times the compressed bytes it came from, counted as
    # it is read. Real checkpoints here reached 1-912 (a process holding 256 MiB of zeros: 912);
    # all-zero memory reaches ~30000 with zstd, so a checkpoint that is almost nothing but
    # zeroed memory needs this raised.
    max_entry_ratio: int = Field(default=4096, ge=1, le=1 << 20)
    # Files of the archive's root filesystem diff and volumes that are setuid or setgid, or carry
    # file capabilities: refused unless allowed (they run with privileges the archive chose).
    allow_setuid_files: bool = False
    # Devices an imported container may be given beyond this node's own NVIDIA devices (as its
    # /dev/nvidia* are) and the nodes runc gives every container: "c MAJOR:MINOR" or "b MAJOR:MINOR",
    # by number, as `ls -l /dev` shows them (a name says nothing: /dev/nvidia-rt can be 1:11, /dev/kmsg).
    allowed_devices: tuple[str, ...] = ()

    @field_validator("allowed_devices")
    @classmethod
    def _device_numbers(cls, devices: tuple[str, ...]) -> tuple[str, ...]:
        for device in devices:
            if not re.fullmatch(r"[cb] [0-9]{1,4}:[0-9]{1,7}", device):
                raise ValueError(f"{device!r} is not 'c MAJOR:MINOR' or 'b MAJOR:MINOR' (numbers as `ls -l /dev` "
                                 "shows them)")
        return devices


class HookConfig(_Section):
    # docker and containerd read no hooks.d: with this on, gpuckpt-runtime adds gpuckpt-hook (the
    # one beside it) to the spec of each container given an NVIDIA GPU on `create`, so their GPU
    # containers land in the node's inventory as podman's do (hooks/main.py).
    add_to_spec: bool = False


class ServiceConfig(_Section):
    # gpuckptd (service/): where a drain puts each container's checkpoint, how many at once, and
    # whether stopping the service (node shutdown) drains first.
    archive_dir: str = "/var/lib/gpuckpt/drain"
    drain_parallel: int = Field(default=4, ge=1, le=64)  # a drain's checkpoints at once, and the restores after
    drain_on_stop: bool = True
    restore_at_start: bool = True
    socket: str = "/run/gpuckpt/gpuckptd.sock"
    # Preemption: a notice starts a drain that starts nothing after its deadline. A URL polled
    # (GCE's instance/preempted, AWS's spot/instance-action, Azure's scheduledevents, or any 200
    # whose body is TRUE), a file whose existence is the notice, or SIGUSR1.
    preemption_url: str = ""
    # The poll reads no http_proxy/https_proxy variable and follows no redirect; a proxy, only where named here.
    preemption_proxy: str = ""
    preemption_file: str = ""
    preemption_poll_s: float = Field(default=5.0, ge=0.5, le=3600)
    preemption_deadline_s: float = Field(default=30.0, gt=0, le=86_400)  # when the notice names no time
    # Periodic checkpoints (--leave-running) of the recorded containers: every this many minutes
    # for all of them (0: only those annotated io.gpuckpt.checkpoint-every=MINUTES), keeping the
    # newest `checkpoint_keep` of each in archive_dir/periodic/ID/.
    checkpoint_every_min: float = Field(default=0, ge=0, le=525_600)
    checkpoint_min_interval_min: float = Field(default=5, ge=0.01, le=525_600)  # the most often an annotation may ask
    checkpoint_keep: int = Field(default=3, ge=1, le=100)
    # All periodic checkpoints together, in GiB (0: no limit): past it the oldest go first, never
    # the newest of a container still recorded; those of containers gone count, and go, like the rest.
    checkpoint_budget_gib: float = Field(default=0, ge=0, le=1_000_000)
    # Idle GPU reclaim: a container annotated io.gpuckpt.idle-suspend-after=MINUTES whose GPUs all
    # showed 0 % utilization (NVML) that long is suspended (gpuckpt suspend); at least this long.
    idle_min_minutes: float = Field(default=10, ge=0.01, le=525_600)

    @field_validator("preemption_url", "preemption_proxy")
    @classmethod
    def _http(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL (or empty)")
        return value

    @field_validator("preemption_file")
    @classmethod
    def _absolute_or_empty(cls, value: str) -> str:
        if value and (not value.startswith("/") or "\0" in value):
            raise ValueError("must be an absolute path (or empty)")
        return value

    @field_validator("archive_dir", "socket")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or "\0" in value:
            raise ValueError("must be an absolute path")
        return value


POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a stored checkpoint's name (store/manifest.py's rule)


class PoolConfig(_Section):
    # gpuckptd's warm pool (service/pool.py): standbys restored ahead, per checkpoint (a stored
    # checkpoint's name, or an archive's absolute path) -> how many, each restored with
    # `gpuckpt restore --standby` and handed out by `gpuckpt pool take`.
    standbys: dict[str, Annotated[int, Field(ge=0, le=64)]] = {}
    # The host memory all standbys together may hold, in bytes (0: none is restored). A standby
    # whose checkpoint's last standby held more than is left is not restored.
    host_budget_bytes: int = Field(default=0, ge=0)
    store_dir: str = "/var/lib/gpuckpt/store"  # where a checkpoint named by name is stored

    @field_validator("standbys")
    @classmethod
    def _checkpoints(cls, standbys: dict[str, int]) -> dict[str, int]:
        for checkpoint in standbys:
            archive = checkpoint.startswith("/") and os.path.normpath(checkpoint) == checkpoint
            if not archive and not POOL_NAME.fullmatch(checkpoint):
                raise ValueError(f"{checkpoint[:80]!r}: give a stored checkpoint's name (letters, digits, '_.-') "
                                 "or an archive's absolute, normalised path")
        return standbys

    @field_validator("store_dir")
    @classmethod
    def _absolute_store(cls, value: str) -> str:
        if not value.startswith("/") or "\0" in value:
            raise ValueError("must be an absolute path")
        return value


class Config(_Section):
    # runc, crun, another runc-compatible name looked up on PATH, or an absolute path.
    delegate: str = "runc"
    cuda: CudaConfig = CudaConfig()
    criu: CriuConfig = CriuConfig()
    import_: ImportConfig = Field(default=ImportConfig(), alias="import")  # `import` is a keyword
    hook: HookConfig = HookConfig()
    service: ServiceConfig = ServiceConfig()
    pool: PoolConfig = PoolConfig()

    @field_validator("delegate")
    @classmethod
    def _delegate_is_name_or_absolute(cls, value: str) -> str:
        if not value or ("/" in value and not value.startswith("/")):
            raise ValueError("must be a program name looked up on PATH (runc, crun) or an absolute path")
        return value


def _field(section: type[BaseModel], key: str) -> FieldInfo:
    """A section's field by its key in the file (the alias, where the name is a Python keyword)."""
    return next(field for name, field in section.model_fields.items() if (field.alias or name) == key)


def _describe(errors: list[ErrorDetails], model: type[BaseModel]) -> str:
    """The first problem as one line: the key, the value given and what is allowed. A key of several
    types (`"auto"` or a number) fails once per type, each under a location pydantic adds below the key
    (`literal['auto']`): those are one problem, and their messages together say what is allowed."""
    error = errors[0]
    key_parts: list[str] = []
    walked: object = model  # a section, or at the end the key's own type
    for part in error["loc"]:
        if not (isinstance(walked, type) and issubclass(walked, BaseModel)) or not any(
                (field.alias or name) == str(part) for name, field in walked.model_fields.items()):
            break
        key_parts.append(str(part))
        walked = _field(walked, str(part)).annotation
    if error["type"] == "extra_forbidden":
        key = ".".join(str(part) for part in error["loc"])
        section: type[BaseModel] = model
        for part in error["loc"][:-1]:
            # every key above the unknown one is a table: a section's field whose type is a section
            section = cast(type[BaseModel], _field(section, str(part)).annotation)
        allowed = ", ".join(field.alias or name for name, field in section.model_fields.items())
        return f"unknown key {key!r} (allowed: {allowed})"
    key = ".".join(key_parts) or ".".join(str(part) for part in error["loc"])
    same_key = [each for each in errors if tuple(each["loc"][:len(key_parts)]) == tuple(error["loc"][:len(key_parts)])]
    messages = list(dict.fromkeys(each["msg"].removeprefix("Value error, ").split(", unable to")[0]
                                  for each in same_key))
    if all(message.startswith("Input should be ") for message in messages):
        messages = [" or ".join(message.removeprefix("Input should be ") for message in messages)
                    .replace("greater than or equal to ", "a number >= ")]
        messages[0] = f"should be {messages[0]}"
    return f"{key} = {error['input']!r}: {'; '.join(messages)}"


def validated_toml(text: str, source: str, model: type[ModelT],
                   describe: Callable[[list[ErrorDetails]], str]) -> ModelT:
    """TOML text as `model`; a ConfigError naming `source` and, through `describe` (given every problem,
    the first first), the first problem."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(f"{source}: {describe(error.errors())}") from None


def parse_config(text: str, source: str) -> Config:
    """Validate TOML text; `source` names the file in errors."""
    return validated_toml(text, source, Config, lambda errors: _describe(errors, Config))


def load_config(path: str | None = None) -> Config:
    """Read and validate the configuration; the defaults where no file exists."""
    path = path or config_path()
    try:
        with open(path, "rb") as config_file:
            status = os.fstat(config_file.fileno())
            text = config_file.read().decode("utf-8")
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read: {error}") from None
    # The shim runs as root on every container operation: its config must be as
    # trusted as the shim itself.
    if os.geteuid() == 0 and (status.st_uid != 0 or status.st_mode & 0o022):
        raise ConfigError(f"{path}: must be owned by root and writable by root only")
    return parse_config(text, path)
