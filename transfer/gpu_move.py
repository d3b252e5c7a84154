"""A podman checkpoint restored onto other GPUs of this node: `--gpu KIND=NAME` on `gpuckpt import`, `gpuckpt store
restore` and `gpuckpt restore`.

podman's --import makes the restored container from the archive's spec.dump as it is (libpod
generateContainerSpec: config.json is spec.dump; no CDI device is injected again), so the GPUs it gets are the
device nodes spec.dump lists. A move rewrites them as the staged archive passes to podman: each CDI device of the
checkpoint (config.dump's cdiDevices, in order) gives way to the one named on the command line, looked up in this
node's CDI specs (oci/cdi.py): the old device's nodes leave spec.dump's linux.devices and its device-cgroup rules,
the new one's come in with this node's numbers (read from the host's node), and cdiDevices names the new devices
(podman injects those at the container's next fresh start). The shim then finds the new GPUs in the restore spec
and restores the CUDA state onto them (docs/runtime.md); it makes the container's /dev nodes follow the spec
(shim/devnodes.py). Only a device whose CDI edits are device nodes alone moves (a whole GPU in nvidia-ctk's
specs); one that also mounts files or sets the environment is refused, as is a name this node's specs lack.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ImageError, UsageError
from ..oci.cdi import CDI_DIRS, CdiDevice, spec_files
from ..oci.podman_archive import CONFIG_DUMP, SPEC_DUMP, json_object

# CDI's fully qualified device name (vendor.com/class=name; SPEC.md "Fully-qualified device name")
QUALIFIED = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}\.[a-z]{2,63}/[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}="
                       r"[a-zA-Z0-9][a-zA-Z0-9_.:-]{0,127}")
QUALIFIED_FORM = "KIND=NAME as the engines take it (nvidia.com/gpu=2, nvidia.com/gpu=GPU-<uuid>)"


@dataclass(frozen=True)
class Node:
    """A device node as the OCI spec lists it."""

    path: str
    type: str
    major: int
    minor: int


@dataclass
class GpuMove:
    """The checkpoint's CDI devices onto `targets`, in order; filled from config.dump as it passes."""

    targets: Sequence[str]
    cdi_dirs: Sequence[str] = CDI_DIRS
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (the checkpoint's device, this node's)
    nodes: dict[str, tuple[list[str], list[Node]]] = field(default_factory=dict)  # old device -> its paths, new nodes
    planned: bool = False

    def __post_init__(self) -> None:
        for target in self.targets:
            if not QUALIFIED.fullmatch(target):
                raise UsageError(f"--gpu {target[:80]!r}: give a CDI device name, {QUALIFIED_FORM}")
        if len(set(self.targets)) != len(self.targets):
            raise UsageError("--gpu: each device may be given once")

    def rewrites(self, config_rewrite: Callable[[bytes], bytes]) -> dict[str, Callable[[bytes], bytes]]:
        """The archive entries' rewrites: config.dump (after `config_rewrite`, the import's own) and spec.dump."""
        return {CONFIG_DUMP: lambda data: self.config(config_rewrite(data)), SPEC_DUMP: self.spec}

    def config(self, data: bytes) -> bytes:
        """config.dump with its cdiDevices moved; the move planned from them (and this node's CDI specs)."""
        config = json_object(data, CONFIG_DUMP)
        devices = config.get("cdiDevices") or []
        if not isinstance(devices, list) or not all(isinstance(name, str) for name in devices):
            raise ImageError(f"{CONFIG_DUMP}: cdiDevices is not a list of device names")
        kinds = {target.partition("=")[0] for target in self.targets}
        moving = [name for name in devices if name.partition("=")[0] in kinds]
        if len(moving) != len(self.targets):
            had = ", ".join(moving) or f"no device of {' or '.join(sorted(kinds))}"
            raise UsageError(f"--gpu: give one device for each of the checkpoint's ({had}); "
                             f"{len(self.targets)} given")
        self.pairs = list(zip(moving, self.targets, strict=True))
        for old, new in self.pairs:
            old_paths = [path for path, _ in _device_paths(old, self.cdi_dirs, "the checkpoint's")]
            new_nodes = [_host_node(path, host_path, new) for path, host_path in
                         _device_paths(new, self.cdi_dirs, "--gpu")]
            if len(old_paths) != len(new_nodes):
                raise UsageError(f"--gpu {new}: this node's CDI spec gives it {len(new_nodes)} device node(s), "
                                 f"{old} {len(old_paths)}: a checkpoint moves only between devices of one shape")
            self.nodes[old] = (old_paths, new_nodes)
        self.planned = True
        moved = dict(self.pairs)
        config["cdiDevices"] = [moved.get(name, name) for name in devices]
        return json.dumps(config).encode()

    def spec(self, data: bytes) -> bytes:
        """spec.dump with the checkpoint's device nodes replaced by the targets', in linux.devices and in the
        device cgroup's rules."""
        if not self.planned:
            raise ImageError(f"{SPEC_DUMP} comes before {CONFIG_DUMP} in the archive: --gpu needs podman's order")
        spec = json_object(data, SPEC_DUMP)
        linux = spec.get("linux")
        listed = linux.get("devices") if isinstance(linux, dict) else None
        if not isinstance(linux, dict) or not isinstance(listed, list):
            raise ImageError(f"{SPEC_DUMP}: no linux.devices: the checkpoint's container was given no device nodes")
        by_path = {entry.get("path"): entry for entry in listed if isinstance(entry, dict)}
        replaced: dict[tuple[object, object, object], Node] = {}  # the old node's numbers -> the new node
        for old, _new in self.pairs:
            old_paths, new_nodes = self.nodes[old]
            for path, replacement in zip(old_paths, new_nodes, strict=True):
                entry = by_path.get(path)
                if entry is None:
                    raise ImageError(f"{SPEC_DUMP} lists no {path}, which {old} brings on this node: the "
                                     "checkpoint's node named its devices otherwise; restore it without --gpu")
                replaced[(entry.get("type", "c"), entry.get("major"), entry.get("minor"))] = replacement
                entry.update(path=replacement.path, type=replacement.type, major=replacement.major,
                             minor=replacement.minor)
        resources = linux.get("resources")
        if isinstance(resources, dict) and isinstance(resources.get("devices"), list):
            resources["devices"] = _rules_for(resources["devices"], listed, replaced)
        return json.dumps(spec).encode()

    def summary(self) -> str:
        return ", ".join(f"{old} -> {new}" for old, new in self.pairs)


def _rules_for(rules: list[Any], listed: list[Any], replaced: dict[tuple[object, object, object], Node]) -> list[Any]:
    """The device cgroup's rules after a move: an old node's allow rule goes unless a device still listed has its
    numbers; each new node is allowed as the old one was."""
    listed_numbers = {(entry.get("type", "c"), entry.get("major"), entry.get("minor"))
                      for entry in listed if isinstance(entry, dict)}

    def numbers(rule: Any) -> tuple[object, object, object] | None:
        return (rule.get("type"), rule.get("major"), rule.get("minor")) if isinstance(rule, dict) else None

    kept = [rule for rule in rules if not (rule_numbers := numbers(rule)) or rule_numbers not in replaced
            or not rule.get("allow") or rule_numbers in listed_numbers]
    for old_numbers, node in replaced.items():
        if any(numbers(rule) == (node.type, node.major, node.minor) and rule.get("allow") for rule in kept):
            continue
        access = next((rule.get("access", "rwm") for rule in rules
                       if numbers(rule) == old_numbers and rule.get("allow")), "rwm")
        kept.append({"allow": True, "type": node.type, "major": node.major, "minor": node.minor, "access": access})
    return kept


def _device_paths(qualified: str, cdi_dirs: Sequence[str], whose: str) -> list[tuple[str, str]]:
    """The device nodes this node's CDI specs give `qualified`: (path in the container, path on the host)."""
    device = _find_device(qualified, cdi_dirs, whose)
    edits = device.containerEdits
    if edits.mounts or edits.env:
        raise UsageError(f"{whose} device {qualified}: its CDI edits also mount files or set the environment; "
                         "gpuckpt moves a checkpoint only between devices that are device nodes alone (whole GPUs)")
    if not edits.deviceNodes:
        raise UsageError(f"{whose} device {qualified}: this node's CDI spec gives it no device node")
    return [(node.path, node.hostPath or node.path) for node in edits.deviceNodes]


def _find_device(qualified: str, cdi_dirs: Sequence[str], whose: str) -> CdiDevice:
    kind, _, name = qualified.partition("=")
    kinds: set[str] = set()
    for found in spec_files(cdi_dirs):
        if found.spec is None:
            continue
        kinds.add(found.spec.kind)
        if found.spec.kind == kind:
            for device in found.spec.devices:
                if device.name == name:
                    return device
    known = f"its CDI specs ({', '.join(cdi_dirs)}) name the kinds {', '.join(sorted(kinds))}" if kinds else \
        f"it has no CDI spec in {', '.join(cdi_dirs)} (nvidia-ctk cdi generate writes one)"
    raise UsageError(f"{whose} device {qualified} is not on this node: {known}")


def _host_node(path: str, host_path: str, qualified: str) -> Node:
    """The container's `path` with the numbers of the host's node at `host_path` (no link followed)."""
    try:
        status = os.stat(host_path, follow_symlinks=False)
    except OSError as error:
        raise UsageError(f"{qualified}: its device node {host_path} cannot be read on this node: "
                         f"{error.strerror}") from None
    if not (stat.S_ISCHR(status.st_mode) or stat.S_ISBLK(status.st_mode)):
        raise UsageError(f"{qualified}: {host_path} on this node is not a device node")
    kind = "c" if stat.S_ISCHR(status.st_mode) else "b"
    return Node(path, kind, os.major(status.st_rdev), os.minor(status.st_rdev))
