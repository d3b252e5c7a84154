"""Which devices an imported container spec may name, by identity (type, major, minor), never by name:
a node named /dev/nvidia-rt can be the host's /dev/kmsg.

Allowed: this node's own NVIDIA device nodes as they are here (os.stat of /dev/nvidia*,
/dev/nvidia-caps/*; a node without GPUs has none), the nodes and cgroup rules runc gives every
container, and the operator's `import.allowed_devices`. Read lazily: a spec naming only runc's
defaults (every plain `podman run`) reads neither /dev nor the config.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from typing import NamedTuple

from ..node.config import load_config
from ..node.paths import config_path, dev_dir
from ..oci.spec import Device, DeviceRule, Spec

FULL_ACCESS = frozenset("rwm")


class DeviceId(NamedTuple):
    type: str  # "c" or "b"
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.type} {self.major}:{self.minor}"


# What runc adds to every container itself (libcontainer/specconv AllowedDevices, runc 1.1-1.3), so naming
# it in a spec gives nothing more; with /dev/console (5:1), which crun and docker's defaults give too.
RUNC_DEFAULT_NODES = frozenset(DeviceId("c", major, minor) for major, minor in (
    (1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2)))  # null zero full random urandom tty console ptmx
# runc's rules beyond those nodes: mknod of any node (not opening it), /dev/pts/*, tun/tap (type, major,
# minor with None for any, the access at most)
RUNC_DEFAULT_RULES: tuple[tuple[str, int | None, int | None, frozenset[str]], ...] = (
    ("c", None, None, frozenset("m")), ("b", None, None, frozenset("m")),
    ("c", 136, None, FULL_ACCESS), ("c", 10, 200, FULL_ACCESS))
ALLOWED_DEVICES_KEY = "import.allowed_devices"


def node_nvidia_devices(directory: str | None = None) -> frozenset[DeviceId]:
    """The character devices this node's /dev/nvidia* and /dev/nvidia-caps/* are (links followed: /dev is root's)."""
    directory = directory or dev_dir()
    found = set()
    paths = [os.path.join(directory, name) for name in _names(directory) if name.startswith("nvidia")]
    caps = os.path.join(directory, "nvidia-caps")
    paths += [os.path.join(caps, name) for name in _names(caps)]
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(status.st_mode):
            found.add(DeviceId("c", os.major(status.st_rdev), os.minor(status.st_rdev)))
    return frozenset(found)


def _names(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def parse_device_id(text: str) -> DeviceId:
    """"c MAJOR:MINOR" or "b MAJOR:MINOR", as node/config.py validated import.allowed_devices."""
    kind, _, numbers = text.partition(" ")
    major, _, minor = numbers.partition(":")
    return DeviceId(kind, int(major), int(minor))


class DeviceAllowance:
    """The identities a spec may name beyond runc's defaults; this node's read when first asked."""

    def __init__(self, nvidia: Iterable[DeviceId] | None = None, listed: Iterable[DeviceId] | None = None) -> None:
        self._nvidia = frozenset(nvidia) if nvidia is not None else None
        self._listed = frozenset(listed) if listed is not None else None

    @property
    def nvidia(self) -> frozenset[DeviceId]:
        if self._nvidia is None:
            self._nvidia = node_nvidia_devices()
        return self._nvidia

    @property
    def listed(self) -> frozenset[DeviceId]:
        if self._listed is None:
            self._listed = frozenset(parse_device_id(text) for text in load_config().import_.allowed_devices)
        return self._listed

    def allows(self, device: DeviceId) -> bool:
        return device in RUNC_DEFAULT_NODES or device in self.nvidia or device in self.listed

    def describe(self) -> str:
        nvidia = ", ".join(str(device) for device in sorted(self.nvidia)[:6]) or "none on this node"
        return (f"allowed: this node's NVIDIA devices ({nvidia}), runc's defaults (null, zero, full, random, urandom, "
                f"tty, console, ptmx, pts) and {ALLOWED_DEVICES_KEY} in {config_path()} (\"c MAJOR:MINOR\")")


def _number(value: int | None) -> int | None:
    return None if value is None or value < 0 else value  # runc reads -1 as any number


def node_refusal(device: Device, allowance: DeviceAllowance) -> str | None:
    kind = "c" if device.type == "u" else device.type  # "u": an unbuffered character device
    major, minor = _number(device.major), _number(device.minor)
    shown = f"{device.path[:80]} ({device.type or '?'} {_shown(major)}:{_shown(minor)}"
    if kind in ("c", "b") and major is not None and minor is not None and allowance.allows(
            DeviceId(kind, major, minor)):
        # runc's restore binds the host's file at the device's path there (an external mount keyed by the path):
        # an allowed number at /etc/hosts gave a signed export's container the host's /etc/hosts (attack30h)
        if _host_node_is(device.path, kind, major, minor):
            return None
        return f"{shown}, not the device node at that path on this node)"
    return shown + ")"


def _host_node_is(path: str, kind: str, major: int, minor: int) -> bool:
    """Whether the host's file at `path` (a plain path below /dev) is that device node, in directories only root
    may change: no /dev/shm or /dev/mqueue, where a user could swap a link to /dev/null for one to /etc."""
    parts = path.split("/")
    if len(parts) < 3 or parts[:2] != ["", "dev"] or any(part in ("", ".", "..") for part in parts[1:]):
        return False
    # the host's /dev, where runc binds it from (and a test's own, which stands for it); /dev's links are root's
    roots = tuple(dict.fromkeys(("/dev", dev_dir().rstrip("/"))))
    for root in roots:
        real = os.path.realpath(os.path.join(root, *parts[2:]))
        base = next((base for base in roots if real.startswith(base + "/")), None)
        if base is not None and _is_node(real, base, kind, major, minor):
            return True
    return False


def _is_node(real: str, base: str, kind: str, major: int, minor: int) -> bool:
    """Whether `real` (a resolved path below `base`) is that device node, each directory from `base` down root's
    and written by root alone."""
    try:
        directory = os.path.dirname(real)
        while True:
            status = os.lstat(directory)
            if status.st_uid != 0 or status.st_mode & 0o022:
                return False
            if directory == base:
                break
            directory = os.path.dirname(directory)
        status = os.lstat(real)
    except OSError:
        return False
    is_kind = stat.S_ISCHR(status.st_mode) if kind == "c" else stat.S_ISBLK(status.st_mode)
    return is_kind and status.st_rdev == os.makedev(major, minor)


def rule_refusal(rule: DeviceRule, allowance: DeviceAllowance) -> str | None:
    if not rule.allow:
        return None  # a deny rule takes away, never gives
    kind, major, minor = rule.type or "a", _number(rule.major), _number(rule.minor)
    access = frozenset(rule.access or "rwm")
    if access <= FULL_ACCESS:
        if any((kind, major, minor) == (k, ma, mi) and access <= most for k, ma, mi, most in RUNC_DEFAULT_RULES):
            return None
        if kind in ("c", "b") and major is not None and minor is not None and allowance.allows(
                DeviceId(kind, major, minor)):
            return None
    return f"cgroup rule allow {kind} {_shown(major)}:{_shown(minor)} {rule.access or 'rwm'}"[:120]


def _shown(number: int | None) -> str:
    return "*" if number is None else str(number)


def device_refusals(spec: Spec, where: str, allowance: DeviceAllowance | None = None) -> list[str]:
    """The device nodes (linux.devices) and cgroup allow rules (linux.resources.devices) of `spec` that are
    neither runc's defaults, this node's NVIDIA devices nor the operator's allow-list: one line naming them."""
    allowance = allowance or DeviceAllowance()
    found = [refusal for device in spec.linux.devices if (refusal := node_refusal(device, allowance))]
    found += [refusal for rule in spec.linux.resources.devices if (refusal := rule_refusal(rule, allowance))]
    if not found:
        return []
    found = list(dict.fromkeys(found))
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return [f"host devices in {where} ({', '.join(found[:3])}{more}; {allowance.describe()})"]
