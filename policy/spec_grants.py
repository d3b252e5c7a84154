"""What a restore spec may grant a container: no more than its spec granted when it was checkpointed.

The checkpoint records the spec's hooks, capabilities and device nodes in its signed manifest
(oci.manifest.SpecGrants). A restore the shim cannot trace to `gpuckpt import` (which checks an
archive's spec.dump itself) gets its spec from outside the dump: podman's own `restore --import` and
`restore IMAGE` make it from the archive's spec.dump, which no signature covers. A hook program, a
capability or a device node the checkpointed container did not have is refused: an edited spec.dump
of a signed dump would otherwise run a program as root or give the container a host device.
gpuckpt-hook's own entries (an engine adds them from hooks.d) and NVIDIA device nodes (a restore may
give other GPUs; the GPU checks judge them) are not counted.
"""

from __future__ import annotations

import hashlib
import json
import re

from ..host.safefiles import not_movable_by_others
from ..oci.manifest import SpecGrants
from ..oci.nvidia_paths import NVIDIA_DEVICE_PREFIX
from ..oci.spec import Spec

CAPABILITY = re.compile(r"CAP_[A-Z_]{1,40}")
HOOK_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")


def _hooks(spec: Spec) -> list[str]:
    """Each hook as "STAGE PATH #DIGEST", the digest of its arguments, environment and timeout: the same
    program run otherwise is another hook."""
    hooks = spec.hooks if isinstance(spec.hooks, dict) else {}
    found = []
    for stage in HOOK_STAGES:
        entries = hooks.get(stage)
        for entry in entries if isinstance(entries, list) else []:
            entry = entry if isinstance(entry, dict) else {}
            named = entry.get("path")
            path = named if isinstance(named, str) else "?"
            rest = json.dumps({key: entry.get(key) for key in ("args", "env", "timeout")}, sort_keys=True)
            found.append(f"{stage} {path[:3900]} #{hashlib.sha256(rest.encode()).hexdigest()[:16]}")
    return sorted(set(found))


def _hook_path(hook: str) -> str:
    return hook.split(" ", 1)[1].rsplit(" #", 1)[0]


def _own(source: str, container_id: str) -> str:
    """`source` with podman's directory of the container itself (STORAGE/overlay-containers/ID/ in its graph or run
    root: its /etc/hosts, /dev/shm, secrets) as <self>/: the same container restored under a new ID (podman's
    --import with --name) or from another storage root binds the same. Only a directory no other user can move or
    swap counts as podman's: a user's look-alike under /tmp is a host path like any other."""
    marker = f"/overlay-containers/{container_id}/"
    at = source.find(marker) if container_id else -1
    if at > 0 and not_movable_by_others(source[:at + len(marker)]):
        return "<self>/" + source[at + len(marker):]
    return source


def _binds(spec: Spec, container_id: str) -> list[str]:
    """Each bind mount as "DESTINATION <- SOURCE ro|rw" (the container's own directories as <self>/)."""
    found = []
    for mount in spec.mounts:
        if mount.is_bind():
            source = _own(mount.source, container_id)
            found.append(f"{mount.destination[:1900]} <- {source[:1900]} {'ro' if 'ro' in mount.options else 'rw'}")
    return sorted(set(found))


def grants_of(spec: Spec, container_id: str = "") -> SpecGrants:
    capabilities = spec.process.capabilities.all() if spec.process.capabilities else set()
    devices = {f"{device.type or '?'} {device.major}:{device.minor}" for device in spec.linux.devices
               if not device.path.startswith(NVIDIA_DEVICE_PREFIX) and device.major is not None
               and device.minor is not None and device.type in ("c", "b", "u", "p")}
    return SpecGrants(hooks=_hooks(spec), capabilities=sorted(c for c in capabilities if CAPABILITY.fullmatch(c)),
                      devices=sorted(devices), binds=_binds(spec, container_id))


def widened(recorded: SpecGrants, spec: Spec, own_hooks: frozenset[str], *, hooks_only: bool = False,
            container_id: str = "") -> list[str]:
    """What `spec` grants beyond `recorded`, each as a phrase; [] when nothing. `hooks_only`: its hooks alone (an
    unsigned dump: its devices are judged by the import's allow-list, refuse_foreign_devices). `container_id`: the
    restored container's, whose bind mounts are judged too (podman's bundle: its spec came from spec.dump)."""
    now = grants_of(spec, container_id)
    unknown_capabilities = spec.process.capabilities is not None and any(
        not CAPABILITY.fullmatch(c) for c in spec.process.capabilities.all())
    hooks = [hook.rsplit(" #", 1)[0] for hook in now.hooks
             if hook not in recorded.hooks and _hook_path(hook) not in own_hooks]
    problems = []
    if hooks:
        problems.append(f"hooks ({', '.join(h[:120] for h in hooks[:4])})")
    if hooks_only:
        return problems
    if capabilities := sorted(set(now.capabilities) - set(recorded.capabilities)):
        problems.append(f"capabilities ({', '.join(capabilities[:8])})")
    if unknown_capabilities:
        problems.append("capabilities it names other than CAP_*")
    if devices := sorted(set(now.devices) - set(recorded.devices)):
        problems.append(f"device nodes ({', '.join(devices[:8])})")
    if container_id:
        had = set(recorded.binds) | {bind[:-2] + "ro" for bind in recorded.binds if bind.endswith(" rw")}
        if binds := [bind for bind in now.binds if bind not in had]:
            problems.append(f"bind mounts ({', '.join(b[:160] for b in binds[:3])})")
    return problems
