"""podman's checkpoint archive (`podman container checkpoint --export`), read and streamed.

The layout, as podman 4 writes it and CRI-O and checkpointctl read it: `config.dump`
(podman's container config) and `spec.dump` (the OCI spec) at the top, `checkpoint/`
with CRIU's image (and gpuckpt's manifest), `rootfs-diff.tar`, `network.status`,
`devshm-checkpoint.tar`, `stats-dump`, `artifacts/`. podman reads `config.dump` and
`spec.dump` first, then everything. podman 4.3 writes `artifacts/` and `devshm-checkpoint.tar`,
then `config.dump`, `spec.dump`, the small files, `checkpoint/` (sorted: the GPU manifest before
the pages), `rootfs-diff.tar`; `gpuckpt export` keeps that order. An import relies on it: the
config is checked before any entry of `checkpoint/` (copy_checked's `first`).

Archives are read defensively (`oci.tarstream.checked_name`) and re-emitted entry by
entry, so what reaches podman has passed the same checks as what we unpack.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import tarfile
import time
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO, cast

import zstandard
from pydantic import BaseModel, ConfigDict, ValidationError

from gpuckpt.errors import ImageError
from gpuckpt.host.safefiles import create_private_at, open_directory
from gpuckpt.oci import tarstream
from gpuckpt.oci.archive import close_quietly, decompressed, open_archive, zstd_compressor
from gpuckpt.oci.hooks_d import only_gpuckpt_hooks
from gpuckpt.oci.image_layout import _Hashing
from gpuckpt.oci.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, parse_manifest
from gpuckpt.oci.nvidia_paths import NVIDIA_DEVICE_PREFIX
from gpuckpt.oci.spec import Spec, load_exact_json
from gpuckpt.oci.tarstream import ByteSink, ByteSource, Data
from gpuckpt.transfer.bounds import RatioGuard
from gpuckpt.transfer.staging import PAGES_FILE
from gpuckpt.transfer.staging import PLACEHOLDER as STAGING_PLACEHOLDER

CONFIG_DUMP = "config.dump"
SPEC_DUMP = "spec.dump"
CHECKPOINT_DIR = "checkpoint"
CRIU_INVENTORY = f"{CHECKPOINT_DIR}/inventory.img"
GPU_MANIFEST = f"{CHECKPOINT_DIR}/{MANIFEST_NAME}"
MAX_DUMP_BYTES = 16 << 20
REQUIRED = (CONFIG_DUMP, SPEC_DUMP, CRIU_INVENTORY)
STAGED_PAGES = re.compile(f"{CHECKPOINT_DIR}/{PAGES_FILE.pattern}")  # what an import stages itself


class PodmanConfigDump(BaseModel):
    """The fields of podman's `config.dump` that gpuckpt shows; podman reads the rest itself."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str
    name: str
    rootfsImageID: str = ""
    rootfsImageName: str = ""
    RawImageName: str = ""
    runtime: str = ""
    createdTime: str = ""
    privileged: bool = False
    rootfs: str = ""  # `podman run --rootfs DIR`: the container's root is that host directory
    createNetNS: bool = False  # podman makes the container a network namespace and puts its path in the spec
    # kept by podman's --import unless under its run root; conmon writes them as root, following links
    conmonPidFile: str = ""
    pid_file: str = ""
    # this node's podman secrets by name: copied in at --import, mounted or set as env at the next start
    secrets: list[dict[str, Any]] = []
    secret_env: dict[str, dict[str, Any]] = {}
    # mounted at the container's next start: a host path as an overlay's lower (or upper) layer
    overlayVolumes: list[dict[str, Any]] = []
    # `--pid container:X` and the like: joined at the container's next start (generateSpec), whatever spec.dump says
    ipcNsCtr: str = ""
    mountNsCtr: str = ""
    netNsCtr: str = ""
    pidNsCtr: str = ""
    userNsCtr: str = ""
    utsNsCtr: str = ""
    cgroupNsCtr: str = ""
    spec: Spec | None = None


@dataclass
class PodmanArchive:
    """What a checked podman archive holds: its small files, and the size of everything."""

    path: str
    config: PodmanConfigDump
    config_bytes: bytes
    spec_bytes: bytes
    manifest: Manifest | None
    files: int = 0
    bytes: int = 0
    names: list[str] = field(default_factory=list)
    spec: Spec | None = None


def scan_archive(path: str) -> tuple[Copied, dict[str, bytes]]:
    """Read a whole archive once, every entry checked; what it holds and its small files."""
    kept: dict[str, bytes] = {}
    with open_archive(path) as raw:
        return copy_checked(decompressed(raw), None, path, kept=kept), kept


def check_podman_archive(path: str) -> PodmanArchive:
    """A podman checkpoint archive, read and checked whole; the first problem is an ImageError."""
    copied, kept = scan_archive(path)
    return described(path, kept, copied.names, copied.files, copied.bytes)


def described(path: str, kept: dict[str, bytes], names: list[str], files: int, total: int) -> PodmanArchive:
    """The archive's small files parsed; an ImageError if it is not a podman checkpoint archive."""
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise ImageError(f"{path}: not a podman checkpoint archive: no {', '.join(missing)}")
    archive = described_dumps(path, kept)
    archive.manifest = parse_manifest(kept[GPU_MANIFEST], f"{path}:{GPU_MANIFEST}") if GPU_MANIFEST in kept else None
    archive.files, archive.bytes, archive.names = files, total, names
    return archive


def described_dumps(path: str, kept: dict[str, bytes]) -> PodmanArchive:
    """config.dump and spec.dump parsed, all an import checks before it stages anything."""
    try:
        config = PodmanConfigDump.model_validate(
            load_exact_json(kept[CONFIG_DUMP], f"{path}: {CONFIG_DUMP}", (PodmanConfigDump,), spec_at=("spec",)))
        spec = Spec.model_validate(load_exact_json(kept[SPEC_DUMP], f"{path}: {SPEC_DUMP}", (Spec,)))
    except (ValueError, ValidationError, RecursionError) as error:
        raise ImageError(f"{path}: {CONFIG_DUMP} or {SPEC_DUMP} is not valid: {str(error).splitlines()[0]}") from None
    return PodmanArchive(path, config, kept[CONFIG_DUMP], kept[SPEC_DUMP], None, spec=spec)


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


def _isolation_refusals(spec: Spec, where: str, replaced: frozenset[str]) -> list[str]:
    """What of podman run's own isolation a container config gives up; a path of a namespace in
    `replaced` is one podman's restore sets itself."""
    problems = []
    namespaces = {namespace.type: namespace.path for namespace in spec.linux.namespaces}
    if shared := sorted(OWN_NAMESPACES - namespaces.keys()):
        problems.append(f"the host's {', '.join(shared)} namespace(s) in {where}")
    if joined := sorted(kind for kind, path in namespaces.items() if path and kind not in replaced):
        problems.append(f"namespaces joined by path in {where} ({', '.join(joined)})")
    seccomp = spec.linux.seccomp
    if seccomp is None or seccomp.get("defaultAction") in ("SCMP_ACT_ALLOW", "SCMP_ACT_LOG"):
        allowed = "" if seccomp is None else " (every call allowed by default)"
        problems.append(f"no seccomp filter in {where}{allowed}")
    elif seccomp.get("listenerPath"):
        problems.append(f"no seccomp filter in {where} (its calls handed to {str(seccomp['listenerPath'])[:80]})")
    if unmasked := sorted(MASKED_PATHS - set(spec.linux.maskedPaths)):
        problems.append(f"paths podman masks left visible in {where} ({', '.join(unmasked[:3])})")
    if writable := sorted(READONLY_PATHS - set(spec.linux.readonlyPaths)):
        problems.append(f"paths podman makes read-only left writable in {where} ({', '.join(writable[:3])})")
    return problems


# What podman's --import drops from spec.dump (runtime_ctr.go setupContainer, RemoveMount: the first
# mount of each destination, of any type), its own binds from the container's userdata; 4.3's list, in 5.8's too.
IMPORT_DROPPED_MOUNTS = frozenset({"/dev/shm", "/etc/resolv.conf", "/etc/hostname", "/etc/hosts", "/run/.containerenv",
                                   "/run/secrets"})


def _host_binds(spec: Spec) -> list[str]:
    """The sources of the bind mounts the restored container keeps. A source is not trusted for its
    name (podman's userdata path): a local user can make a path that holds it, linked anywhere."""
    dropped, kept = set(), []
    for mount in spec.mounts:
        if mount.destination in IMPORT_DROPPED_MOUNTS and mount.destination not in dropped:
            dropped.add(mount.destination)
        elif mount.is_bind():
            kept.append(mount.source)
    return kept


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


DEFAULT_RUN_ROOT = "/run/containers/storage"  # root's podman (containers-storage.conf runroot)


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
                    default_run_root: str = DEFAULT_RUN_ROOT) -> list[str]:
    """What in an archive's container config would give its container, or a program it names,
    more of this node than an ordinary `podman run` does: hooks (but gpuckpt-hook's own entries
    for a hook at one of `own_hooks`, this node's), privilege, added capabilities, host bind
    mounts, device nodes other than the NVIDIA ones, a runtime given by path, a root filesystem given by path,
    less isolation (namespaces, seccomp, masked and read-only paths), another container's namespaces, pid
    files outside `run_root` (podman's on this node). podman's own --import trusts all of it."""
    config, problems = archive.config, []
    if not re.fullmatch(r"[0-9a-f]{64}", config.id):
        return [f"a container ID that is not podman's ({config.id[:80]!r})"]
    if "/" in config.runtime:
        problems.append(f"runtime given as a path ({config.runtime})")
    if config.privileged:
        problems.append("a privileged container")
    if config.rootfs:
        problems.append(f"a root filesystem given by path ({config.rootfs[:80]})")
    # podman's restore replaces a pid file that starts with its run root (strings.HasPrefix) and keeps any
    # other: kept, only the paths root's podman itself gives this very container are harmless (in its own
    # root-only directory, named by the archive's own ID, as an archive from a node with the default run
    # root names them on a node with another). On such a node podman never makes that directory: one with
    # files in it is another container's (CRI-O, a second store), whose pid files conmon would replace
    userdata = f"{default_run_root}/overlay-containers/{config.id}/userdata"
    own = set() if _held_by_another(userdata) else {f"{userdata}/{name}" for name in ("conmon.pid", "pidfile")}
    if pid_files := [path for path in (config.conmonPidFile, config.pid_file)
                     if path and not (run_root and path.startswith(run_root)) and path not in own]:
        problems.append(f"pid files podman would write on this node ({', '.join(p[:80] for p in pid_files)})")
    if overlays := [str(volume.get("source", "?"))[:80] for volume in config.overlayVolumes]:
        problems.append(f"host directories as overlay volumes ({', '.join(overlays[:3])})")
    if secrets := [str(secret.get("name", "?"))[:40] for secret in (*config.secrets, *config.secret_env.values())]:
        problems.append(f"this node's podman secrets ({', '.join(secrets[:3])})")
    if joined := [field for field in NAMESPACE_CONTAINERS if getattr(config, field)]:
        problems.append(f"the namespaces of another container ({', '.join(joined)})")
    # podman's restore puts the netns it makes in place of spec.dump's (addNetworkNamespace): an ordinary
    # `podman run` exports the path of the one it made on its own node
    replaced = frozenset({"network"}) if config.createNetNS else frozenset()
    for where, spec in ((SPEC_DUMP, archive.spec), (CONFIG_DUMP, config.spec)):
        if spec is None:
            continue
        if spec.hooks and not only_gpuckpt_hooks(spec.hooks, own_hooks):
            problems.append(f"OCI hooks in {where} ({', '.join(sorted(spec.hooks))})")
        added = spec.process.capabilities.all() - DEFAULT_CAPABILITIES if spec.process.capabilities else set()
        if added:
            problems.append(f"capabilities beyond podman's default in {where} ({', '.join(sorted(added)[:4])})")
        host = _host_binds(spec)
        if host:
            problems.append(f"host bind mounts in {where} ({', '.join(sorted(set(host))[:3])})")
        if kernel := _other_filesystems(spec):
            problems.append(f"kernel filesystems podman run does not mount in {where} ({', '.join(kernel[:3])})")
        # a device node is a piece of the host (a disk, a tty); the GPU's nodes are what gpuckpt moves
        devices = sorted({device.path for device in spec.linux.devices
                          if not device.path.startswith(NVIDIA_DEVICE_PREFIX)})
        if devices:
            problems.append(f"host devices in {where} ({', '.join(devices[:3])})")
        problems += _isolation_refusals(spec, where, replaced)
    return list(dict.fromkeys(problems))


def write_small_entry(out: ByteSink, name: str, data: bytes) -> int:
    """One root-only file entry made here; returns the bytes written."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
    padding = bytes(-len(data) % tarstream.BLOCK)
    header = tarstream.write_header(info, out)
    out.write(data + padding)
    return header + len(data) + len(padding)


# podman's small files, and the GPU manifest where podman puts CRIU's image or at the top (gpuckpt's own archives)
SMALL_FILES = {CONFIG_DUMP: MAX_DUMP_BYTES, SPEC_DUMP: MAX_DUMP_BYTES, GPU_MANIFEST: MAX_MANIFEST_BYTES,
               MANIFEST_NAME: MAX_MANIFEST_BYTES}


# What `podman container checkpoint --export` takes from the container's bundle directory, files or
# directories (podman 4 and 5, libpod's exportCheckpoint): all written before podman opens its target.
EXPORTED = ("artifacts", "devshm-checkpoint.tar", CONFIG_DUMP, SPEC_DUMP, "network.status", "stats-dump", "ctr.log",
            CHECKPOINT_DIR, "rootfs-diff.tar", "deleted.files", "volumes")


def exported_bytes(bundle: str) -> int:
    """The bytes of the files podman's export of the container whose bundle is `bundle` holds,
    counted as copy_checked counts them (regular files' data; links not followed)."""
    total = 0
    for name in EXPORTED:
        top = os.path.join(bundle, name)
        if os.path.isdir(top) and not os.path.islink(top):
            total += sum(_file_bytes(os.path.join(directory, file)) for directory, _, files in os.walk(top)
                         for file in files)
        else:
            total += _file_bytes(top)
    return total


def _file_bytes(path: str) -> int:
    try:
        status = os.lstat(path)
    except OSError:  # gone, or not ours to see: the total is a guide, not a bound
        return 0
    return status.st_size if stat.S_ISREG(status.st_mode) else 0


@dataclass
class Copied:
    """What went through copy_checked: file bytes, regular files, every entry's name."""

    bytes: int = 0
    files: int = 0
    names: list[str] = field(default_factory=list)


def copy_checked(source: ByteSource, out: ByteSink | None, path: str, progress: Callable[[int], None] | None = None,
                 kept: dict[str, bytes] | None = None,
                 divert: Callable[[tarfile.TarInfo], AbstractContextManager[ByteSink] | None] | None = None,
                 trailer: tuple[tuple[str, bytes], ...] = (),
                 observe: Callable[[tarfile.TarInfo], ByteSink | None] | None = None,
                 first: Callable[[dict[str, bytes]], None] | None = None, guard: RatioGuard | None = None) -> Copied:
    """Re-emit the tar read from `source` into `out` (both streams; None: only check), each entry
    checked (oci.tarstream), owned by root. `source` must have readinto().

    With `kept`, the small files (config.dump, spec.dump, the GPU manifests) are also put there.
    `divert(member)` may return a stream for a file's bare data instead (the entry is then left
    out of `out`); `trailer` entries (name, bytes) are added at the end. `observe(member)` hears
    of every entry first and may return a stream that sees a file's data too (transfer.provenance).

    For an import: `first(kept)` checks config.dump and spec.dump as soon as both are read, and
    must have passed before any entry of checkpoint/ comes (a GPU manifest there, parsed as it
    comes, before any pages file): nothing is staged for an archive before its config is checked.
    `guard` (transfer.bounds.RatioGuard) bounds how far each entry's data expands."""
    copied, written, seen = Copied(), 0, set()
    config_checked, pages_seen = first is None, False

    def moved(count: int) -> None:
        copied.bytes += count
        if guard is not None:
            guard.moved(count)
        if progress:
            progress(copied.bytes)

    try:
        for member, reader in tarstream.entries(source, path):
            if member.name in seen:
                raise ImageError(f"{path}: entry {member.name!r} appears twice")
            seen.add(member.name)
            copied.names.append(member.name)
            if member.name.endswith(f"/{STAGING_PLACEHOLDER}") or member.name == STAGING_PLACEHOLDER:
                raise ImageError(f"{path}: archive entry {member.name!r} is gpuckpt's own import placeholder: refused")
            if not config_checked and member.name.partition("/")[0] == CHECKPOINT_DIR:
                raise ImageError(f"{path}: {member.name} comes before {CONFIG_DUMP} and {SPEC_DUMP}: refused (gpuckpt "
                                 "import checks the container config before it stages anything; podman and gpuckpt "
                                 "export write config.dump first)")
            if first is not None and member.name == GPU_MANIFEST and pages_seen:
                raise ImageError(f"{path}: {GPU_MANIFEST} comes after a pages image: refused (it is checked before "
                                 "any page is staged; podman and gpuckpt export write it first)")
            pages_seen = pages_seen or STAGED_PAGES.fullmatch(member.name) is not None
            if guard is not None:
                guard.entry(member.name, member.size)
            watch = observe(member) if observe is not None else None
            diverted = divert(member) if divert is not None and member.isfile() else None
            if diverted is not None:
                copied.files += 1
                with diverted as data_file:
                    tarstream.copy_data(reader, member.size, data_file, moved, pad=False, watch=watch)
                continue
            if out is not None:
                written += tarstream.write_header(member, out)
            if not member.isfile():
                continue
            copied.files += 1
            if kept is not None and member.name in SMALL_FILES:
                if member.size > SMALL_FILES[member.name]:
                    raise ImageError(f"{path}: {member.name} declares {member.size} bytes, "
                                     f"more than {SMALL_FILES[member.name]}")
                data = bytearray()
                moved_bytes = tarstream.copy_data(reader, member.size, _Collect(data, out), watch=watch)
                kept[member.name] = bytes(data[:member.size])
                copied.bytes += member.size
                if first is not None and not config_checked and CONFIG_DUMP in kept and SPEC_DUMP in kept:
                    config_checked = True
                    first(kept)
                if first is not None and member.name == GPU_MANIFEST:
                    parse_manifest(kept[GPU_MANIFEST], f"{path}:{GPU_MANIFEST}")
            else:
                moved_bytes = tarstream.copy_data(reader, member.size, out, moved, watch=watch)
            written += moved_bytes if out is not None else 0
        if out is not None:
            for name, trailing in trailer:
                written += write_small_entry(out, name, trailing)
            tarstream.write_end(out, written)
    except (zstandard.ZstdError, EOFError, zlib.error) as error:
        raise ImageError(f"{path}: truncated or corrupt archive: {error}") from None
    except OSError as error:
        if out is not None:
            raise  # the writing side: its own error (a full disk, a reader gone)
        raise ImageError(f"{path}: truncated or corrupt archive: {error}") from None
    return copied


class _Collect:
    """Keeps what is written (padding included) and passes it on."""

    def __init__(self, data: bytearray, out: ByteSink | None) -> None:
        self.data, self.out = data, out

    def write(self, chunk: Data) -> None:
        self.data += chunk
        if self.out is not None:
            self.out.write(chunk)


class ArchiveWriter:
    """A podman checkpoint archive written as it streams: zstd (multithreaded) into FILE.partial,
    renamed into place once complete; root-only, as it holds process memory. Both names are
    reached through a descriptor of their directory (the operator's, opened once): a link put at
    either name is replaced, never followed."""

    def __init__(self, path: str, threads: int = 0) -> None:
        self.path, self.threads, self.partial = path, threads, f"{path}.partial"
        self.name = os.path.basename(path)
        self._file: BinaryIO | None = None
        self._hashed: _Hashing | None = None
        self._zstd: zstandard.ZstdCompressionWriter | None = None
        self.dir_fd = open_directory(os.path.dirname(path) or ".")

    def layer(self) -> zstandard.ZstdCompressionWriter:
        self._file = os.fdopen(create_private_at(self.dir_fd, f"{self.name}.partial"), "wb")
        self._hashed = _Hashing(self._file)  # the archive's sha256, for its signature
        # a writer: write and flush are all stream_writer uses
        self._zstd = zstd_compressor(self.threads).stream_writer(cast(IO[bytes], self._hashed), closefd=False)
        return self._zstd

    def finish(self, archive: PodmanArchive) -> None:
        if self._file is None or self._hashed is None or self._zstd is None:
            raise ImageError(f"{self.path}: the archive was never written")
        self._zstd.close()
        self._file.close()
        self.sha256 = self._hashed.hash.hexdigest()
        os.replace(f"{self.name}.partial", self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self._close_directory()

    def discard(self) -> None:
        close_quietly(self._zstd, self._file)
        if self.dir_fd >= 0:
            try:
                os.unlink(f"{self.name}.partial", dir_fd=self.dir_fd)
            except FileNotFoundError:
                pass
        self._close_directory()

    def _close_directory(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1
