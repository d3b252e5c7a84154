"""The parts of an OCI runtime spec (bundle config.json) that gpuckpt reads.

Unknown fields are kept and ignored: the spec is the engine's, not ours.
"""

from __future__ import annotations

import json
import os
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ImageError
from ..host.safefiles import read_bounded
from .nvidia_paths import NVIDIA_DEVICE_PREFIX, gpu_minor
from .state import ContainerState

MAX_SPEC_BYTES = 16 << 20


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class Device(_Part):
    path: str
    type: str = ""
    major: int | None = None
    minor: int | None = None
    fileMode: int | None = None
    uid: int | None = None
    gid: int | None = None


class Mount(_Part):
    destination: str
    source: str = ""
    type: str = ""
    options: list[str] = []

    def is_bind(self) -> bool:
        return self.type == "bind" or "bind" in self.options or "rbind" in self.options


class Namespace(_Part):
    type: str
    path: str = ""  # given: the container joins that namespace instead of getting its own


class DeviceRule(_Part):
    """A cgroup device rule (linux.resources.devices): no type means every type ("a"), no major or
    minor (or -1, runc's wildcard) every number, no access all of "rwm"."""
    allow: bool = False
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    access: str | None = None


class Resources(_Part):
    devices: list[DeviceRule] = []


class Linux(_Part):
    devices: list[Device] = []
    resources: Resources = Resources()
    namespaces: list[Namespace] = []
    seccomp: dict[str, Any] | None = None
    maskedPaths: list[str] = []
    readonlyPaths: list[str] = []


class Capabilities(_Part):
    bounding: list[str] = []
    effective: list[str] = []
    permitted: list[str] = []
    inheritable: list[str] = []
    ambient: list[str] = []

    def all(self) -> set[str]:
        return {*self.bounding, *self.effective, *self.permitted, *self.inheritable, *self.ambient}


class Process(_Part):
    env: list[str] = []
    capabilities: Capabilities | None = None


class Root(_Part):
    path: str = ""


class Spec(_Part):
    process: Process = Process()
    root: Root = Root()
    mounts: list[Mount] = []
    linux: Linux = Linux()
    annotations: dict[str, str] = {}
    hooks: dict[str, Any] | None = None

    def env(self, name: str) -> str | None:
        for entry in self.process.env:
            key, _, value = entry.partition("=")
            if key == name:
                return value
        return None

    def nvidia_device_paths(self) -> list[str]:
        paths = [device.path for device in self.linux.devices if device.path.startswith(NVIDIA_DEVICE_PREFIX)]
        paths += [mount.destination for mount in self.mounts if mount.destination.startswith(NVIDIA_DEVICE_PREFIX)]
        return sorted(set(paths))

    def gpu_minors(self) -> list[int]:
        """Minor numbers of the /dev/nvidiaN GPUs the container is given."""
        return sorted({minor for path in self.nvidia_device_paths() if (minor := gpu_minor(path)) is not None})

    def rootfs(self, bundle: str) -> str:
        """The container's root filesystem on the host: root.path, relative to the bundle if not absolute."""
        return os.path.normpath(os.path.join(bundle, self.root.path)) if self.root.path else ""

    def bind_source(self, destination: str) -> str | None:
        """Where the bind mount at `destination` comes from (the last one there wins, as mounts stack)."""
        sources = [mount.source for mount in self.mounts
                   if os.path.normpath(mount.destination) == destination and mount.is_bind() and mount.source]
        return sources[-1] if sources else None

    def own_network_namespace(self) -> bool:
        """Whether the runtime makes the container a network namespace of its own (one without a path)."""
        return any(namespace.type == "network" and not namespace.path for namespace in self.linux.namespaces)

    def wants_gpu(self) -> bool:
        """Whether the spec gives the container an NVIDIA GPU (devices, or the toolkit's variable)."""
        visible = self.env("NVIDIA_VISIBLE_DEVICES")
        return bool(self.nvidia_device_paths()) or (visible not in (None, "", "void", "none"))


# OCI runtime-spec keys (config-linux.md, config.md) by where they sit, whether or not our models read them
HOOK_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
_HOOK = ("path", "args", "env", "timeout")
_SYSCALL = ("names", "action", "errnoRet", "args")
OCI_KEYS_AT: dict[tuple[str, ...], tuple[str, ...]] = {
    (): ("ociVersion", "hooks", "process", "mounts", "linux", "root", "annotations", "hostname", "domainname"),
    ("hooks",): HOOK_STAGES,
    **{("hooks", stage): _HOOK for stage in HOOK_STAGES},
    ("root",): ("path", "readonly"),
    ("mounts",): ("destination", "source", "type", "options", "uidMappings", "gidMappings"),
    ("process",): ("terminal", "consoleSize", "cwd", "env", "args", "commandLine", "rlimits", "apparmorProfile",
                   "capabilities", "noNewPrivileges", "oomScoreAdj", "scheduler", "selinuxLabel", "ioPriority",
                   "execCPUAffinity", "user"),
    ("process", "user"): ("uid", "gid", "umask", "additionalGids", "username"),
    ("process", "capabilities"): ("bounding", "effective", "inheritable", "permitted", "ambient"),
    ("linux",): ("namespaces", "uidMappings", "gidMappings", "timeOffsets", "devices", "netDevices", "cgroupsPath",
                 "rootfsPropagation", "seccomp", "sysctl", "resources", "intelRdt", "memoryPolicy", "personality",
                 "maskedPaths", "readonlyPaths", "mountLabel"),
    ("linux", "namespaces"): ("type", "path"),
    ("linux", "uidMappings"): ("containerID", "hostID", "size"),
    ("linux", "gidMappings"): ("containerID", "hostID", "size"),
    ("linux", "devices"): ("type", "path", "major", "minor", "fileMode", "uid", "gid"),
    ("linux", "seccomp"): ("defaultAction", "defaultErrnoRet", "architectures", "flags", "listenerPath",
                           "listenerMetadata", "syscalls"),
    ("linux", "seccomp", "syscalls"): _SYSCALL,
    ("linux", "seccomp", "syscalls", "args"): ("index", "value", "valueTwo", "op"),
}


def known_keys(model: Any, at: tuple[str, ...] = ()) -> dict[tuple[str, ...], set[str]]:
    """Every field name and alias of a model and of the models its fields hold, by where they sit."""
    known: dict[tuple[str, ...], set[str]] = {}
    pending = [(model, at)]
    while pending:
        kind, where = pending.pop()
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            for name, info in kind.model_fields.items():
                names = {key for key in (name, info.alias, info.validation_alias) if isinstance(key, str)}
                known.setdefault(where, set()).update(names)
                pending += [(info.annotation, (*where, key)) for key in names]
        else:
            pending += [(arg, where) for arg in typing.get_args(kind)]  # list[Mount], Spec | None
    return known


def load_exact_json(data: bytes | str, what: str, models: tuple[Any, ...], spec_at: tuple[str, ...] = ()) -> Any:
    """JSON that podman and runc (Go's encoding/json) read as our models do, the OCI spec at `spec_at`.

    Go fills a field from a key that only case-folds to its name ("Hooks", or "hooks" with its k
    the Kelvin sign U+212A), which our models would skip: such a key where a model or the OCI spec names
    that field, or two keys of one object that fold alike, is an ImageError.
    """
    known: dict[tuple[str, ...], set[str]] = {}
    for model in models:
        for where, names in known_keys(model).items():
            known.setdefault(where, set()).update(names)
    for where, oci_names in OCI_KEYS_AT.items():
        known.setdefault((*spec_at, *where), set()).update(oci_names)

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys: dict[str, str] = {}
        for key, _ in pairs:
            if key.casefold() in keys:
                raise ImageError(f"{what}: keys {ascii(keys[key.casefold()])} and {ascii(key)} in one object; "
                                 "keys must be spelled exactly, each once")
            keys[key.casefold()] = key
        return dict(pairs)

    document = json.loads(data, object_pairs_hook=once)
    _refuse_folded_keys(document, known, what)
    return document


def _refuse_folded_keys(document: Any, known: dict[tuple[str, ...], set[str]], what: str) -> None:
    """Every object of `document` walked: a key that only case-folds to a name known at its place is refused."""
    pending: list[tuple[Any, tuple[str, ...]]] = [(document, ())]
    while pending:
        value, where = pending.pop()
        if isinstance(value, list):
            pending += [(item, where) for item in value]
        elif isinstance(value, dict):
            names = known.get(where, set())
            folded = {name.casefold(): name for name in names}
            for key, item in value.items():
                if key not in names and key.casefold() in folded:
                    place = ".".join(where) or "the top level"
                    raise ImageError(f"{what}: key {ascii(key)} in {place} is {folded[key.casefold()]!r} spelled "
                                     "otherwise; keys must be spelled exactly")
                pending.append((item, (*where, key)))


def read_spec(bundle: str) -> Spec:
    path = os.path.join(bundle, "config.json")
    text = read_bounded(path, MAX_SPEC_BYTES, path)
    try:
        return Spec.model_validate(json.loads(text))
    except ValueError as error:  # JSON and pydantic errors
        detail = error.errors()[0]["msg"] if isinstance(error, ValidationError) else str(error)
        raise ImageError(f"{path}: invalid OCI spec: {detail}") from None


def container_annotations(state: ContainerState) -> dict[str, str]:
    """A container's annotations as its runtime uses them: the bundle's, overridden by those
    runc kept in its state when the container was created."""
    return {**read_annotations(state.bundle), **(state.annotations or {})}


def read_annotations(bundle: str) -> dict[str, str]:
    """The bundle's annotations, read as leniently as the runtime reads them; {} if it has none.

    Policy checks use this rather than `read_spec`, so that a spec our model finds odd
    cannot slip an annotation past them; a file no runtime could parse yields {}.
    """
    path = os.path.join(bundle, "config.json")
    try:
        raw = json.loads(read_bounded(path, MAX_SPEC_BYTES, path))
    except (ImageError, ValueError):
        return {}
    annotations = raw.get("annotations") if isinstance(raw, dict) else None
    return {str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {}
