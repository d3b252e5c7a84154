"""What an imported archive's container config may ask of this node: no more than an ordinary
`podman run` gives a container (podman's own --import trusts all of it)."""

from __future__ import annotations

import os
import posixpath
import re
import stat

from ..node.hooks_d import only_gpuckpt_hooks
from ..oci.bundle_layout import DEFAULT_RUN_ROOT
from ..oci.nested_tar import VOLUME_NAME
from ..oci.podman_archive import CONFIG_DUMP, SPEC_DUMP, PodmanArchive, PodmanConfigDump, volume_directory
from ..oci.spec import Spec
from .devices import device_refusals
from .spec_grants import container_own

# podman's default capabilities (containers.conf default_capabilities, podman 4)
DEFAULT_CAPABILITIES = frozenset(f"CAP_{name}" for name in (
    "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP",
    "SETUID", "SYS_CHROOT"))


# What every podman run gives a container of its own, and hides or makes read-only in its /proc and
# /sys (podman 4.3's and 5.8's defaults, containers/common pkg/config): without them a container
# shares the host's processes or network, or writes /proc/sys (kernel.core_pattern runs a program
# on the host), or reads the kernel's memory and keys.
OWN_NAMESPACES = frozenset({"pid", "network", "ipc", "uts", "mount"})
MASKED_PATHS = frozenset({"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                          "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"})
READONLY_PATHS = frozenset({"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"})


def _isolation_refusals(spec: Spec, where: str, replaced: frozenset[str], *, seccomp: bool = True) -> list[str]:
    """What of podman run's own isolation a container config gives up; a path of a namespace in
    `replaced` is one podman's restore sets itself. `seccomp`: a filter asked for too."""
    problems = []
    namespaces = {namespace.type: namespace.path for namespace in spec.linux.namespaces}
    if shared := sorted(OWN_NAMESPACES - namespaces.keys()):
        problems.append(f"the host's {', '.join(shared)} namespace(s) in {where}")
    if joined := sorted(kind for kind, path in namespaces.items() if path and kind not in replaced):
        problems.append(f"namespaces joined by path in {where} ({', '.join(joined)})")
    if seccomp:
        problems += _seccomp_refusals(spec, where)
    if unmasked := sorted(MASKED_PATHS - set(spec.linux.maskedPaths)):
        problems.append(f"paths podman masks left visible in {where} ({', '.join(unmasked[:3])})")
    # a masked path is hidden, which is more than read-only (runc's default spec masks /proc/asound)
    if writable := sorted(READONLY_PATHS - set(spec.linux.readonlyPaths) - set(spec.linux.maskedPaths)):
        problems.append(f"paths podman makes read-only left writable in {where} ({', '.join(writable[:3])})")
    return problems


def _seccomp_refusals(spec: Spec, where: str) -> list[str]:
    seccomp = spec.linux.seccomp
    if seccomp is None or seccomp.get("defaultAction") in ("SCMP_ACT_ALLOW", "SCMP_ACT_LOG"):
        allowed = "" if seccomp is None else " (every call allowed by default)"
        return [f"no seccomp filter in {where}{allowed}"]
    if seccomp.get("listenerPath"):
        return [f"no seccomp filter in {where} (its calls handed to {str(seccomp['listenerPath'])[:80]})"]
    return []


# runc's default spec (`runc spec`) gives CAP_AUDIT_WRITE beside what podman run gives: audit records, no more
UNSIGNED_CAPABILITIES = DEFAULT_CAPABILITIES | {"CAP_AUDIT_WRITE"}
# podman sets these itself at a restore (its network namespace, a pod's): a path there is the engine's doing
ENGINE_JOINED = frozenset({"network", "ipc", "pid", "uts", "cgroup", "user", "mount"})


def unsigned_restore_refusals(spec: Spec, container_id: str, own_dirs: tuple[str, ...]) -> list[str]:
    """What the restore spec of a dump no signature vouches for may not ask. Its spec comes with the dump
    (podman's own --import takes it from spec.dump), so it is held to what `gpuckpt import` holds spec.dump to
    without --trust-config: a capability set within podman run's (and runc's default CAP_AUDIT_WRITE), no bind
    mount but the container's own files in podman's directories of it (policy/spec_grants.py container_own,
    `own_dirs`), not
    even a named volume's (nothing says the volume is this container's: attack30f bound another's), no kernel
    filesystem podman run does not mount as it does, podman run's namespaces, masked and read-only paths. A
    seccomp filter is not asked for (runc's default spec has none; CRIU's images are held to the spec's); hooks
    and devices are judged apart (spec_grants, refuse_foreign_devices). attack30e reached host root under
    restore:any through a spec.dump binding the host's disk and one mounting proc at /mnt."""
    where = "the restore bundle's config.json"
    problems = []
    capabilities = spec.process.capabilities
    if capabilities is None:
        problems.append(f"no capability set in {where} (the runtime would leave the images' unbounded)")
    elif added := capabilities.all() - UNSIGNED_CAPABILITIES:
        problems.append(f"capabilities beyond podman's default in {where} ({', '.join(sorted(added)[:4])})")
    host = sorted({mount.source for mount in spec.mounts if mount.is_bind()
                   and not container_own(mount.source, container_id, own_dirs).startswith("<self>/")})
    if host:
        problems.append(f"host bind mounts in {where} ({', '.join(source[:80] for source in host[:3])})")
    if kernel := _other_filesystems(spec):
        problems.append(f"kernel filesystems podman run does not mount in {where} ({', '.join(kernel[:3])})")
    return problems + _isolation_refusals(spec, where, ENGINE_JOINED, seccomp=False)


# What podman's --import drops from spec.dump (runtime_ctr.go setupContainer, RemoveMount: the first
# mount of each destination, of any type), its own binds from the container's userdata; 4.3's list, in 5.8's too.
IMPORT_DROPPED_MOUNTS = frozenset({"/dev/shm", "/etc/resolv.conf", "/etc/hostname", "/etc/hosts", "/run/.containerenv",
                                   "/run/secrets"})


def _host_binds(spec: Spec, volumes: dict[str, str]) -> list[str]:
    """The sources of the bind mounts the restored container keeps, but its named volumes' (`volumes`:
    destination -> the directory this node's podman makes for that volume, which the import made sure
    does not exist yet). A source is not trusted for its name (podman's userdata path): a local user can
    make a path that holds it, linked anywhere."""
    dropped, kept = set(), []
    for mount in spec.mounts:
        if mount.destination in IMPORT_DROPPED_MOUNTS and mount.destination not in dropped:
            dropped.add(mount.destination)
        elif mount.is_bind() and volumes.get(posixpath.normpath(mount.destination)) != mount.source:
            kept.append(mount.source)
    return kept


def volume_directories(config: PodmanConfigDump, graph_root: str) -> dict[str, str]:
    """Each named volume's destination -> the directory this node's podman (its local driver, under
    `graph_root`) makes for it."""
    if not graph_root:
        return {}
    return {posixpath.normpath(volume.dest): volume_directory(graph_root, volume.volumeName)
            for volume in config.namedVolumes if re.fullmatch(VOLUME_NAME, volume.volumeName)}


# The kernel filesystems `podman run` mounts: where (None: anywhere, a new instance of its own) and
# whether read-only. Another proc mount has none of the masked or read-only paths (/proc/sys writable:
# kernel.core_pattern runs a program on the host), sysfs or cgroup writable reach the host's kernel,
# and overlay, a disk or anything else mounts what the options name from the host.
PODMAN_FILESYSTEMS: dict[str, tuple[str | None, bool]] = {
    "proc": ("/proc", False), "sysfs": ("/sys", True), "cgroup": ("/sys/fs/cgroup", True),
    "cgroup2": ("/sys/fs/cgroup", True), "tmpfs": (None, False), "devpts": (None, False), "mqueue": (None, False)}


def _other_filesystems(spec: Spec) -> list[str]:
    """The mounts, not binds, that podman run would not have made as they are."""
    found = []
    for mount in spec.mounts:
        if mount.is_bind():
            continue
        if mount.type not in PODMAN_FILESYSTEMS:
            found.append(f"{mount.type or 'untyped'} at {mount.destination}")
            continue
        where, read_only = PODMAN_FILESYSTEMS[mount.type]
        if (where is not None and posixpath.normpath(mount.destination) != where) or (
                read_only and ("ro" not in mount.options or "rw" in mount.options)):
            found.append(f"{mount.type} at {mount.destination}" + (" writable" if read_only else ""))
    return found


NAMESPACE_CONTAINERS = ("ipcNsCtr", "mountNsCtr", "netNsCtr", "pidNsCtr", "userNsCtr", "utsNsCtr", "cgroupNsCtr")




def _held_by_another(userdata: str) -> bool:
    """Whether something is at a container's userdata directory: a directory with files (another
    container's, of a store that uses that run root), a link or a file. Absent or empty is free."""
    try:
        return not stat.S_ISDIR(os.lstat(userdata).st_mode) or bool(os.listdir(userdata))
    except FileNotFoundError:
        return False
    except OSError:
        return True


def import_refusals(archive: PodmanArchive, own_hooks: frozenset[str] = frozenset(), run_root: str = "",
                    default_run_root: str = DEFAULT_RUN_ROOT, graph_root: str = "") -> list[str]:
    """What in an archive's container config would give its container, or a program it names,
    more of this node than an ordinary `podman run` does: hooks (but gpuckpt-hook's own entries
    for a hook at one of `own_hooks`, this node's), privilege, added capabilities, host bind
    mounts, device nodes other than the NVIDIA ones, a root filesystem given by path,
    less isolation (namespaces, seccomp, masked and read-only paths), another container's namespaces, pid
    files outside `run_root` (podman's on this node). podman's own --import trusts all of it. The runtime
    it names is never asked: podman is given gpuckpt-runtime (cli/transfer.py). A named volume's bind of
    its directory under `graph_root` (this node's podman storage) is the volume, not a host bind."""
    config, problems = archive.config, []
    if not re.fullmatch(r"[0-9a-f]{64}", config.id):
        return [f"a container ID that is not podman's ({config.id[:80]!r})"]
    if config.privileged:
        problems.append("a privileged container")
    if config.rootfs:
        problems.append(f"a root filesystem given by path ({config.rootfs[:80]})")
    problems += _node_resources(config, run_root, default_run_root)
    problems += volume_refusals(config, archive.spec, graph_root)
    # podman's restore puts the netns it makes in place of spec.dump's (addNetworkNamespace): an ordinary
    # `podman run` exports the path of the one it made on its own node
    replaced = frozenset({"network"}) if config.createNetNS else frozenset()
    volumes = volume_directories(config, graph_root)
    for where, spec in ((SPEC_DUMP, archive.spec), (CONFIG_DUMP, config.spec)):
        if spec is not None:
            problems += _spec_refusals(spec, where, own_hooks, replaced, volumes)
    return list(dict.fromkeys(problems))


def _node_resources(config: PodmanConfigDump, run_root: str, default_run_root: str) -> list[str]:
    """This node's things the container config names: pid files, host directories, secrets, other containers."""
    problems = []
    if pid_files := _foreign_pid_files(config, run_root, default_run_root):
        problems.append(f"pid files podman would write on this node ({', '.join(p[:80] for p in pid_files)})")
    if overlays := [str(volume.get("source", "?"))[:80] for volume in config.overlayVolumes]:
        problems.append(f"host directories as overlay volumes ({', '.join(overlays[:3])})")
    if secrets := [str(secret.get("name", "?"))[:40] for secret in (*config.secrets, *config.secret_env.values())]:
        problems.append(f"this node's podman secrets ({', '.join(secrets[:3])})")
    if joined := [field for field in NAMESPACE_CONTAINERS if getattr(config, field)]:
        problems.append(f"the namespaces of another container ({', '.join(joined)})")
    return problems


# What `-v NAME:DEST:OPTIONS` puts in a named volume's options: mount flags. Anything else (podman's
# `volume-opt=type=none,o=bind,device=/etc`, a driver's options) would make the volume a host directory.
VOLUME_OPTIONS = frozenset({"rw", "ro", "z", "Z", "U", "nosuid", "suid", "nodev", "dev", "noexec", "exec", "bind",
                            "rbind", "private", "rprivate", "shared", "rshared", "slave", "rslave", "copy", "nocopy"})


def volume_refusals(config: PodmanConfigDump, spec: Spec | None = None, graph_root: str = "") -> list[str]:
    """Named volumes podman would make (or take) for the container: by a name it could have written, at an
    absolute place, with mount flags only, and (given spec.dump's `spec` and this node's podman storage at
    `graph_root`) mounted there from the directory podman makes for it, as the shim demands before it writes the
    volume's content: podman makes the container and the volume before the shim runs. Refused with
    --trust-config too: the import writes into them."""
    problems: list[str] = []
    for volume in config.namedVolumes:
        name, found = volume.volumeName[:80], len(problems)
        if not re.fullmatch(VOLUME_NAME, volume.volumeName):
            problems.append(f"a volume name podman does not make ({name!r})")
        if not volume.dest.startswith("/") or posixpath.normpath(volume.dest) != volume.dest.rstrip("/") or \
                "\0" in volume.dest:
            problems.append(f"volume {name} mounted at {volume.dest[:80]!r}, not an absolute normalized path")
        if extra := [option[:60] for option in volume.options if option not in VOLUME_OPTIONS]:
            problems.append(f"volume {name} with options beyond mount flags ({', '.join(extra[:3])})")
        if spec is not None and graph_root and len(problems) == found:  # a name and place fit to look up
            problems += _volume_bind_refusals(spec, volume.volumeName, volume.dest.rstrip("/") or "/", graph_root)
    return problems


def _volume_bind_refusals(spec: Spec, name: str, destination: str, graph_root: str) -> list[str]:
    """Whether spec.dump mounts the volume `name` at `destination` from its directory on this node."""
    directory = volume_directory(graph_root, name)
    source = spec.bind_source(destination)
    if source is None:
        return [f"volume {name} at {destination[:80]}, which {SPEC_DUMP} does not mount (a volume of config.dump "
                f"alone; allowed: {SPEC_DUMP} binds {directory} there)"]
    if source != directory:
        return [f"volume {name} at {destination[:80]}, which {SPEC_DUMP} mounts from {source[:80]} (allowed: the "
                f"volume's directory on this node, {directory})"]
    return []


def _foreign_pid_files(config: PodmanConfigDump, run_root: str, default_run_root: str) -> list[str]:
    """The config's pid files podman's restore would write on this node.

    podman's restore replaces a pid file that starts with its run root (strings.HasPrefix) and keeps any
    other: kept, only the paths root's podman itself gives this very container are harmless (in its own
    root-only directory, named by the archive's own ID, as an archive from a node with the default run
    root names them on a node with another). On such a node podman never makes that directory: one with
    files in it is another container's (CRI-O, a second store), whose pid files conmon would replace."""
    userdata = f"{default_run_root}/overlay-containers/{config.id}/userdata"
    own = set() if _held_by_another(userdata) else {f"{userdata}/{name}" for name in ("conmon.pid", "pidfile")}
    return [path for path in (config.conmonPidFile, config.pid_file)
            if path and not (run_root and path.startswith(run_root)) and path not in own]


def _spec_refusals(spec: Spec, where: str, own_hooks: frozenset[str], replaced: frozenset[str],
                   volumes: dict[str, str]) -> list[str]:
    """What one OCI spec of the archive (`where`: spec.dump or config.dump's) would give its container beyond
    an ordinary `podman run`."""
    problems = []
    if spec.hooks and not only_gpuckpt_hooks(spec.hooks, own_hooks):
        problems.append(f"OCI hooks in {where} ({', '.join(sorted(spec.hooks))})")
    added = spec.process.capabilities.all() - DEFAULT_CAPABILITIES if spec.process.capabilities else set()
    if added:
        problems.append(f"capabilities beyond podman's default in {where} ({', '.join(sorted(added)[:4])})")
    host = _host_binds(spec, volumes)
    if host:
        problems.append(f"host bind mounts in {where} ({', '.join(sorted(set(host))[:3])})")
    if kernel := _other_filesystems(spec):
        problems.append(f"kernel filesystems podman run does not mount in {where} ({', '.join(kernel[:3])})")
    # a device node is a piece of the host (a disk, a tty); the GPU's nodes, by number, are what gpuckpt moves
    problems += device_refusals(spec, where)
    return problems + _isolation_refusals(spec, where, replaced)
