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
import os
import re

from ..host.libc import RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, openat2
from ..host.safefiles import not_movable_by_others
from ..node.hook_entry import spec_entry
from ..oci.manifest import SpecGrants
from ..oci.spec import HOOK_STAGES, Spec
from .devices import DeviceAllowance, node_refusal, rule_refusal

CAPABILITY = re.compile(r"CAP_[A-Z_]{1,40}")


def _hook(stage: str, entry: dict[str, object]) -> str:
    """A hook as "STAGE PATH #DIGEST", the digest of its arguments, environment and timeout: the same program run
    otherwise (other arguments, an LD_PRELOAD) is another hook."""
    named = entry.get("path")
    path = named if isinstance(named, str) else "?"
    rest = json.dumps({key: entry.get(key) for key in ("args", "env", "timeout")}, sort_keys=True)
    return f"{stage} {path[:3900]} #{hashlib.sha256(rest.encode()).hexdigest()[:16]}"


def _hooks(spec: Spec) -> list[str]:
    hooks = spec.hooks if isinstance(spec.hooks, dict) else {}
    found = []
    for stage in HOOK_STAGES:
        entries = hooks.get(stage)
        found += [_hook(stage, entry if isinstance(entry, dict) else {})
                  for entry in (entries if isinstance(entries, list) else [])]
    return sorted(set(found))


def _own_entries(own_hooks: frozenset[str]) -> set[str]:
    """gpuckpt-hook's entries exactly as hooks.d and hook.add_to_spec write them (no environment): only these are
    the node's own; its path with other arguments or an environment is any other hook."""
    return {_hook(stage, spec_entry(path, stage)) for path in own_hooks for stage in HOOK_STAGES}


def container_own(source: str, container_id: str) -> str:
    """`source` with podman's directory of the container itself (STORAGE/overlay-containers/ID/ in its graph or run
    root: its /etc/hosts, /dev/shm, secrets) as <self>/: the same container restored under a new ID (podman's
    --import with --name) or from another storage root binds the same. Only a directory no other user can move or
    swap counts as podman's (a user's look-alike under /tmp is a host path like any other), and only a plain path
    below it: no '.', '..' or empty component, no symbolic link on the way (an archive's volume tar can plant a
    root-owned overlay-containers/ID/userdata -> /etc, and '<userdata>/../../..' climbs to /: attack30f)."""
    marker = f"/overlay-containers/{container_id}/"
    at = source.find(marker) if container_id else -1
    if at <= 0:
        return source
    prefix, rest = source[:at + len(marker)], source[at + len(marker):]
    parts = rest.split("/")
    if rest and all(part not in ("", ".", "..") for part in parts) and not_movable_by_others(prefix) \
            and not _links_below(prefix, parts):
        return "<self>/" + rest
    return source


def _links_below(prefix: str, parts: list[str]) -> bool:
    """Whether the path `parts` below `prefix` goes through a symbolic link (or cannot be looked at for another
    reason): the kernel's own walk (openat2 RESOLVE_NO_SYMLINKS), one descriptor, no path looked up twice."""
    try:
        directory = os.open(prefix, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False  # nothing there to mount: the runtime refuses it (and no other user may make it)
    except OSError:
        return True
    try:
        os.close(openat2(directory, "/".join(parts), os.O_PATH, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS))
    except FileNotFoundError:
        return False
    except OSError:
        return True  # ELOOP: a link on the way
    finally:
        os.close(directory)
    return False


def _binds(spec: Spec, container_id: str) -> list[str]:
    """Each bind mount as "DESTINATION <- SOURCE ro|rw" (the container's own directories as <self>/)."""
    found = []
    for mount in spec.mounts:
        if mount.is_bind():
            source = container_own(mount.source, container_id)
            found.append(f"{mount.destination[:1900]} <- {source[:1900]} {'ro' if 'ro' in mount.options else 'rw'}")
    return sorted(set(found))


def grants_of(spec: Spec, container_id: str = "", allowance: DeviceAllowance | None = None) -> SpecGrants:
    capabilities = spec.process.capabilities.all() if spec.process.capabilities else set()
    allowance = allowance or DeviceAllowance()
    devices = {refusal for device in spec.linux.devices if (refusal := node_refusal(device, allowance))}
    rules = {refusal for rule in spec.linux.resources.devices if (refusal := rule_refusal(rule, allowance))}
    return SpecGrants(hooks=_hooks(spec), capabilities=sorted(c for c in capabilities if CAPABILITY.fullmatch(c)),
                      devices=sorted(devices), device_rules=sorted(rules), binds=_binds(spec, container_id))


def widened(recorded: SpecGrants, spec: Spec, own_hooks: frozenset[str], *, hooks_only: bool = False,
            container_id: str = "", allowance: DeviceAllowance | None = None) -> list[str]:
    """What `spec` grants beyond `recorded`, each as a phrase; [] when nothing. `hooks_only`: its hooks alone (an
    unsigned dump: its devices are judged by the import's allow-list, refuse_foreign_devices). `container_id`: the
    restored container's, whose bind mounts are judged too (podman's bundle: its spec came from spec.dump)."""
    now = grants_of(spec, container_id, allowance)
    unknown_capabilities = spec.process.capabilities is not None and any(
        not CAPABILITY.fullmatch(c) for c in spec.process.capabilities.all())
    own = _own_entries(own_hooks)
    hooks = [hook.rsplit(" #", 1)[0] for hook in now.hooks if hook not in recorded.hooks and hook not in own]
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
    if rules := sorted(set(now.device_rules) - set(recorded.device_rules)):
        problems.append(f"device rules ({', '.join(rules[:8])})")
    if container_id:
        had = set(recorded.binds) | {bind[:-2] + "ro" for bind in recorded.binds if bind.endswith(" rw")}
        if binds := [bind for bind in now.binds if bind not in had]:
            problems.append(f"bind mounts ({', '.join(b[:160] for b in binds[:3])})")
    return problems
