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
from collections.abc import Callable

from ..host.conmon import StorageRoots
from ..host.libc import RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, openat2
from ..host.podman_state import PodmanRecord
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


def podman_own_dirs(bundle: str, roots: StorageRoots | None, container_id: str) -> tuple[str, ...]:
    """podman's two directories of the container being restored: the bundle (GRAPHROOT/overlay-containers/ID/
    userdata: /dev/shm's source) and RUNROOT/overlay-containers/ID/userdata (/etc/hosts, /etc/hostname,
    /run/.containerenv), RUNROOT as the podman that runs gave its conmon (host/conmon.py), only where its graph
    root is the bundle's. Never from the container's config: an archive's config.dump sets its pid file and its
    conmon's, anywhere (attack30g's review of this very choice)."""
    parts = bundle.split("/")
    if not (container_id and len(parts) > 4 and parts[0] == "" and bundle == os.path.normpath(bundle) and
            parts[-3:] == ["overlay-containers", container_id, "userdata"]):
        return ()
    graph_root = "/".join(parts[:-3])
    if roots is None or roots.graph_root != graph_root:
        return (bundle,)
    return (bundle, f"{roots.run_root}/overlay-containers/{container_id}/userdata")


def container_own(source: str, container_id: str, own_dirs: tuple[str, ...] | None = None) -> str:
    """`source` as <self>/userdata/NAME where it is a file of podman's own directories of the container (its
    /etc/hosts, /dev/shm, secrets): the same container restored under a new ID or storage root binds the same.

    At a restore (`own_dirs`, podman_own_dirs): only a path in exactly those directories (root's, made by
    podman for this container), plain (no '.', '..' or empty part), that exists and has no symbolic link from /
    on (openat2 RESOLVE_NO_SYMLINKS: an archive's root entries, untarred by podman into the bundle, may plant
    one). A look-alike elsewhere, under /tmp, in a volume or in another container's root is a host path: a
    prefix match trusted what a user or an archive had made, and a check of a missing path let a local user
    make it after (attack30f, attack30g). At a checkpoint (the running container's spec, recorded): podman's
    layout by name."""
    if own_dirs is not None:
        for directory in own_dirs:
            rest = source.removeprefix(directory + "/")
            if rest != source and _plain_relative(rest) and _plain_from_root(source):
                return "<self>/userdata/" + rest
        return source
    marker = f"/overlay-containers/{container_id}/"
    at = source.find(marker) if container_id else -1
    if at <= 0:
        return source
    rest = source[at + len(marker):]
    return "<self>/" + rest if _plain_relative(rest) else source


def _plain_relative(path: str) -> bool:
    """A relative path with no '.', '..' or empty part."""
    return bool(path) and all(part not in ("", ".", "..") for part in path.split("/"))


def _plain_from_root(path: str) -> bool:
    """Whether `path` exists with no symbolic link anywhere on it: the kernel's own walk from /, one call."""
    try:
        root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.close(openat2(root, path.lstrip("/"), os.O_PATH, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS))
    except OSError:
        return False  # missing, a link on the way (ELOOP), or unreadable: not the container's own
    finally:
        os.close(root)
    return True


def _binds(spec: Spec, container_id: str, own_dirs: tuple[str, ...] | None) -> list[str]:
    """Each bind mount as "DESTINATION <- SOURCE ro|rw" (the container's own directories as <self>/)."""
    found = []
    for mount in spec.mounts:
        if mount.is_bind():
            source = container_own(mount.source, container_id, own_dirs)
            found.append(f"{mount.destination[:1900]} <- {source[:1900]} {'ro' if 'ro' in mount.options else 'rw'}")
    return sorted(set(found))


def grants_of(spec: Spec, container_id: str = "", allowance: DeviceAllowance | None = None,
              own_dirs: tuple[str, ...] | None = None) -> SpecGrants:
    capabilities = spec.process.capabilities.all() if spec.process.capabilities else set()
    allowance = allowance or DeviceAllowance()
    devices = {refusal for device in spec.linux.devices if (refusal := node_refusal(device, allowance))}
    rules = {refusal for rule in spec.linux.resources.devices if (refusal := rule_refusal(rule, allowance))}
    return SpecGrants(hooks=_hooks(spec), capabilities=sorted(c for c in capabilities if CAPABILITY.fullmatch(c)),
                      devices=sorted(devices), device_rules=sorted(rules),
                      binds=_binds(spec, container_id, own_dirs))


def widened(recorded: SpecGrants, spec: Spec, own_hooks: frozenset[str], *, hooks_only: bool = False,
            container_id: str = "", allowance: DeviceAllowance | None = None,
            own_dirs: tuple[str, ...] | None = None) -> list[str]:
    """What `spec` grants beyond `recorded`, each as a phrase; [] when nothing. `hooks_only`: its hooks alone (an
    unsigned dump: its devices are judged by the import's allow-list, refuse_foreign_devices). `container_id`: the
    restored container's, whose bind mounts are judged too (podman's bundle: its spec came from spec.dump)."""
    now = grants_of(spec, container_id, allowance, own_dirs)
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


# the OCI namespace types, as /proc/PID/ns names them
PROC_NS = {"network": "net", "ipc": "ipc", "uts": "uts", "pid": "pid", "mount": "mnt", "cgroup": "cgroup",
           "user": "user", "time": "time"}


# the engines' named network namespaces: podman's (netavark's, CNI's) and containerd CRI's in /run/netns, docker's in
# /run/docker/netns; /var/run is /run
NETNS_PATH = re.compile(r"(?:/var)?/run/(?:docker/)?netns/[A-Za-z0-9_.-]{1,200}")
# what a pod's members join of its infra container (podman 4.3.1 pod --share: cgroup, ipc, net, pid, uts; --userns);
# never its mount namespace
INFRA_SHARED = frozenset({"cgroup", "ipc", "net", "pid", "uts", "user"})
PROC_NS_PATH = re.compile(r"/proc/[1-9][0-9]{0,9}/ns/([a-z]+)")  # podman's for a pod's or container's shared ones


def namespace_path_refusals(spec: Spec, podman: Callable[[], PodmanRecord | None] = lambda: None) -> list[str]:
    """The namespaces `spec` joins by a path no engine would give, or that are the host's (ours: the runtime
    runs in the node's), or another container's, each as "TYPE (PATH: why)". podman names a network namespace it
    made in /run/netns and another container's namespaces as /proc/PID/ns/TYPE; podman's own --import keeps
    spec.dump's paths where config.dump says it makes none, and config.dump comes with an archive: a signed export's
    spec.dump joined a host process's network namespace, and a path a user or a container swapped right after the
    check (a missing target, then a link to /proc/self/ns/net) did too (attack30h, attack30i); another container's
    network namespace by /run/netns or /proc/PID, and its IPC and UTS namespaces, joined as well (attack30k). Only
    paths no user or container can change pass, checked for what they are now; a missing one is refused. Of
    those, one no process is in passes (podman's new network namespace for this restore, or one the operator
    named: `--network ns:PATH`; never a /proc/PID path, PID's own); one a process is in, only where `podman()`
    (its database's record of this container, read only then) says podman put it: the network namespace it made
    for this container, or the namespaces of its pod's infra container it shares (not its mount namespace). A
    path that is not a namespace's file is refused too (/run/netns/.. is /run)."""
    refused = []
    for namespace in spec.linux.namespaces:
        path, kind = namespace.path, PROC_NS.get(namespace.type)
        if not path:
            continue
        if kind is None or not _engine_gives(namespace.type, kind, path):
            refused.append(f"{namespace.type} ({path[:120]}: not a path an engine gives)")
            continue
        try:
            host, found = os.stat(f"/proc/self/ns/{kind}"), os.stat(path)  # the namespace a /proc link names
        except OSError as error:
            refused.append(f"{namespace.type} ({path[:120]}: {error.strerror})")
            continue
        if found.st_dev != host.st_dev:  # nsfs: every namespace's file is on it, /run/netns/.. is not
            refused.append(f"{namespace.type} ({path[:120]}: not a namespace)")
        elif (found.st_dev, found.st_ino) == (host.st_dev, host.st_ino):
            refused.append(f"{namespace.type} ({path[:120]}: the host's)")
        elif (pid := _proc_pid(path) or _occupant(kind, found)) and \
                not _podmans_own(namespace.type, kind, path, podman()):
            refused.append(f"{namespace.type} ({path[:120]}: process {pid}'s, another container's; allowed: the "
                           "namespace podman made for this container, its pod's infra container's, or one no "
                           "process is in)")
    return refused


def _proc_pid(path: str) -> int:
    """The process a /proc/PID/ns/TYPE path names, 0 for another path. That process is in the namespace (it names
    its own), whatever a scan of /proc sees a moment later: a user's process in network namespaces of its own (a
    user namespace needs no privilege) flips between two by setns, and the scan found it in the other one, so "no
    process is in it" let a container in with that user, who handed its root an fd of the host's / over an
    abstract unix socket (attack30l)."""
    found = PROC_NS_PATH.fullmatch(path)
    return int(path.split("/")[2]) if found else 0


def _podmans_own(namespace_type: str, kind: str, path: str, podman: PodmanRecord | None) -> bool:
    """Whether podman's database put this path in the spec: the network namespace it made for the container, or
    its pod's infra container's namespace (podman 4.3.1 restore: infraContainer.namespacePath)."""
    if podman is None:
        return False
    return (namespace_type == "network" and bool(podman.netns) and path == podman.netns) or \
        (podman.infra_pid > 0 and kind in INFRA_SHARED and path == f"/proc/{podman.infra_pid}/ns/{kind}")


def _occupant(kind: str, namespace: os.stat_result) -> int:
    """A process (or thread) of the node in that namespace, 0 if none: a namespace podman made for the restore, or
    one the operator named, has none yet; another container's has that container's."""
    for pid in sorted((name for name in os.listdir("/proc") if name.isdigit()), key=int):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # ended meanwhile
        for task in tasks:
            try:
                found = os.stat(f"/proc/{pid}/task/{task}/ns/{kind}")
            except OSError:
                continue
            if (found.st_dev, found.st_ino) == (namespace.st_dev, namespace.st_ino):
                return int(pid)
    return 0


def _engine_gives(namespace_type: str, kind: str, path: str) -> bool:
    """Whether an engine names a namespace of that type so: a network one in its named directory (through
    /var/run only where that is the usual link to /run), any as /proc/PID/ns/KIND."""
    if namespace_type == "network" and NETNS_PATH.fullmatch(path):
        return not path.startswith("/var/run/") or os.path.realpath("/var/run") == "/run"
    proc = PROC_NS_PATH.fullmatch(path)
    return proc is not None and proc[1] == kind
