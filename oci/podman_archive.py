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

import json
import os
import re
import stat
import tarfile
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO, cast

import zstandard
from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ImageError
from ..host.safefiles import create_private_at, open_directory
from . import tarstream
from .archive import HashingWriter, RatioGuard, close_quietly, decompressed, open_archive, zstd_compressor
from .image_names import PAGES_FILE, STAGING_PLACEHOLDER
from .manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, parse_manifest
from .nested_tar import (
    DELETED_FILES,
    MAX_DELETED_FILES_BYTES,
    ROOTFS_DIFF,
    NestedTarCheck,
    is_nested_tar,
    parse_deleted_files,
)
from .spec import Spec, load_exact_json
from .tarstream import ByteSink, ByteSource, Data

CONFIG_DUMP = "config.dump"
SPEC_DUMP = "spec.dump"
CHECKPOINT_DIR = "checkpoint"
CRIU_INVENTORY = f"{CHECKPOINT_DIR}/inventory.img"
GPU_MANIFEST = f"{CHECKPOINT_DIR}/{MANIFEST_NAME}"
MAX_DUMP_BYTES = 16 << 20
REQUIRED = (CONFIG_DUMP, SPEC_DUMP, CRIU_INVENTORY)
STAGED_PAGES = re.compile(f"{CHECKPOINT_DIR}/{PAGES_FILE.pattern}")  # what an import stages itself


class NamedVolume(BaseModel):
    """One of config.dump's named volumes (libpod ContainerNamedVolume)."""

    model_config = ConfigDict(extra="allow")

    volumeName: str
    dest: str
    options: list[str] = []


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
    pod: str = ""  # the pod's ID, where the container was in one: podman restores it only into a pod (--pod)
    # `--pid container:X` and the like: joined at the container's next start (generateSpec), whatever spec.dump says
    ipcNsCtr: str = ""
    mountNsCtr: str = ""
    netNsCtr: str = ""
    pidNsCtr: str = ""
    userNsCtr: str = ""
    utsNsCtr: str = ""
    cgroupNsCtr: str = ""
    # named volumes (`-v NAME:DEST:OPTIONS`): made, or taken if this node has one of that name, at --import
    namedVolumes: list[NamedVolume] = []
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


def volume_directory(graph_root: str, name: str) -> str:
    """Where root's podman (its local volume driver) keeps a named volume's data, under its storage."""
    return f"{graph_root}/volumes/{name}/_data"


def json_object(data: bytes, name: str) -> dict[str, Any]:
    """One of the archive's small JSON files (config.dump, spec.dump) as a JSON object, or one ImageError."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ImageError(f"{name} is not valid JSON: {str(error)[:120]}") from None
    if not isinstance(value, dict):
        raise ImageError(f"{name} is not a JSON object")
    return value


def with_runtime(config_dump: bytes, runtime: str) -> bytes:
    """config.dump as an import gives it to podman: its "runtime" (podman's OCIRuntime) set to `runtime`,
    and no "mounts" (paths podman unmounts on the host when the container goes: podman adds its own
    /dev/shm); every other key as it was."""
    config = json_object(config_dump, CONFIG_DUMP)
    config["runtime"] = runtime
    config["mounts"] = []
    return json.dumps(config).encode()


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


def copy_checked(source: ByteSource, out: ByteSink | None, path: str, *,
                 progress: Callable[[int], None] | None = None, kept: dict[str, bytes] | None = None,
                 divert: Callable[[tarfile.TarInfo], AbstractContextManager[ByteSink] | None] | None = None,
                 trailer: Sequence[tuple[str, bytes]] = (),
                 observe: Callable[[tarfile.TarInfo], ByteSink | None] | None = None,
                 first: Callable[[dict[str, bytes]], None] | None = None, guard: RatioGuard | None = None,
                 nested: NestedChecks | None = None,
                 rewrite: Mapping[str, Callable[[bytes], bytes]] | None = None) -> Copied:
    """Re-emit the tar read from `source` into `out` (both streams; None: only check), each entry
    checked (oci.tarstream), owned by root. `source` must have readinto().

    With `kept`, the small files (config.dump, spec.dump, the GPU manifests) are also put there.
    `divert(member)` may return a stream for a file's bare data instead (the entry is then left
    out of `out`); `trailer` entries (name, bytes) are added at the end (read then: a list may grow
    while the copy goes). `observe(member)` hears
    of every entry first and may return a stream that sees a file's data too (transfer.provenance).

    For an import: `first(kept)` checks config.dump and spec.dump as soon as both are read, and
    must have passed before any entry of checkpoint/ comes (a GPU manifest there, parsed as it
    comes, before any pages file): nothing is staged for an archive before its config is checked.
    `guard` (oci.archive.RatioGuard) bounds how far each entry's data expands. With `nested`, the
    tars inside (rootfs-diff.tar, volumes, /dev/shm) and deleted.files are checked too (oci.nested_tar):
    what podman would unpack into the container's root before any runtime runs. `rewrite[name]`
    makes the data `out` gets of a small file from what was read (and checked: `first` sees the original)."""
    copy = _CheckedCopy(out, path, progress=progress, kept=kept, divert=divert, observe=observe, first=first,
                        guard=guard, nested=nested)
    copy.rewrite = dict(rewrite or {})
    try:
        for member, reader in tarstream.entries(source, path):
            copy.admit(member)
            copy.entry(member, reader)
        copy.end(trailer)
    except (zstandard.ZstdError, EOFError, zlib.error) as error:
        raise ImageError(f"{path}: truncated or corrupt archive: {error}") from None
    except OSError as error:
        if out is not None:
            raise  # the writing side: its own error (a full disk, a reader gone)
        raise ImageError(f"{path}: truncated or corrupt archive: {error}") from None
    return copy.copied


class _CheckedCopy:
    """One pass of copy_checked: its options, what went through, and where the import's order checks stand."""

    def __init__(self, out: ByteSink | None, path: str, *, progress: Callable[[int], None] | None,
                 kept: dict[str, bytes] | None,
                 divert: Callable[[tarfile.TarInfo], AbstractContextManager[ByteSink] | None] | None,
                 observe: Callable[[tarfile.TarInfo], ByteSink | None] | None,
                 first: Callable[[dict[str, bytes]], None] | None, guard: RatioGuard | None,
                 nested: NestedChecks | None) -> None:
        self.out, self.path, self.progress, self.kept = out, path, progress, kept
        self.divert, self.observe, self.first, self.guard, self.nested = divert, observe, first, guard, nested
        self.copied, self.written, self.seen = Copied(), 0, set[str]()
        self.config_checked, self.pages_seen = first is None, False
        self.rewrite: dict[str, Callable[[bytes], bytes]] = {}

    def moved(self, count: int) -> None:
        self.copied.bytes += count
        if self.guard is not None:
            self.guard.moved(count)
        if self.progress:
            self.progress(self.copied.bytes)

    def admit(self, member: tarfile.TarInfo) -> None:
        """The entry's name and place in the archive checked, and counted, before any of its data moves."""
        path, name = self.path, member.name
        if name in self.seen:
            raise ImageError(f"{path}: entry {name!r} appears twice")
        self.seen.add(name)
        self.copied.names.append(name)
        if name.endswith(f"/{STAGING_PLACEHOLDER}") or name == STAGING_PLACEHOLDER:
            raise ImageError(f"{path}: archive entry {name!r} is gpuckpt's own import placeholder: refused")
        if not self.config_checked and (name.partition("/")[0] == CHECKPOINT_DIR or name in (ROOTFS_DIFF,
                                                                                              DELETED_FILES)):
            raise ImageError(f"{path}: {name} comes before {CONFIG_DUMP} and {SPEC_DUMP}: refused (gpuckpt "
                             "import checks the container config before it stages anything; podman and gpuckpt "
                             "export write config.dump first)")
        if self.first is not None and name == GPU_MANIFEST and self.pages_seen:
            raise ImageError(f"{path}: {GPU_MANIFEST} comes after a pages image: refused (it is checked before "
                             "any page is staged; podman and gpuckpt export write it first)")
        self.pages_seen = self.pages_seen or STAGED_PAGES.fullmatch(name) is not None
        if self.guard is not None:
            self.guard.entry(name, member.size)

    def entry(self, member: tarfile.TarInfo, reader: tarstream.EntryReader) -> None:
        """The entry moved on: diverted, kept (a small file) or written to `out`, its data watched."""
        watch = self.observe(member) if self.observe is not None else None
        check = self._nested_check(member)
        if check is not None:
            watch = check if watch is None else _Both(watch, check)
        diverted = self.divert(member) if self.divert is not None and member.isfile() else None
        if diverted is not None:
            self.copied.files += 1
            with diverted as data_file:
                tarstream.copy_data(reader, member.size, data_file, self.moved, pad=False, watch=watch)
            if check is not None:
                check.finish()
            return
        rewritten = self.rewrite.get(member.name) if self.out is not None and member.isfile() else None
        if self.out is not None and rewritten is None:
            self.written += tarstream.write_header(member, self.out)
        if not member.isfile():
            return
        self.copied.files += 1
        if self.kept is not None and member.name in SMALL_FILES:
            moved_bytes = self._keep(member, reader, self.kept, watch, self.out if rewritten is None else None)
            if rewritten is not None and self.out is not None:
                moved_bytes = write_small_entry(self.out, member.name, rewritten(self.kept[member.name]))
        else:
            moved_bytes = tarstream.copy_data(reader, member.size, self.out, self.moved, watch=watch)
        self.written += moved_bytes if self.out is not None else 0
        if check is not None:
            check.finish()

    def _nested_check(self, member: tarfile.TarInfo) -> NestedTarCheck | _DeletedFiles | None:
        """The check of a nested tar or deleted.files as its data passes, where imports ask for it."""
        if self.nested is None or not member.isfile():
            return None
        where = f"{self.path}: {member.name}"
        if is_nested_tar(member.name):
            return NestedTarCheck(where, self.nested.allow_setuid)
        if member.name == DELETED_FILES:
            if member.size > MAX_DELETED_FILES_BYTES:
                raise ImageError(f"{where} declares {member.size} bytes, more than {MAX_DELETED_FILES_BYTES}")
            return _DeletedFiles(where)
        return None

    def _keep(self, member: tarfile.TarInfo, reader: tarstream.EntryReader, kept: dict[str, bytes],
              watch: ByteSink | None, out: ByteSink | None) -> int:
        """A small file put in `kept` as it passes (config.dump and spec.dump checked by `first` once both
        are in, a GPU manifest parsed); the bytes read."""
        if member.size > SMALL_FILES[member.name]:
            raise ImageError(f"{self.path}: {member.name} declares {member.size} bytes, "
                             f"more than {SMALL_FILES[member.name]}")
        data = bytearray()
        moved_bytes = tarstream.copy_data(reader, member.size, _Collect(data, out), watch=watch)
        kept[member.name] = bytes(data[:member.size])
        self.copied.bytes += member.size
        if self.first is not None and not self.config_checked and CONFIG_DUMP in kept and SPEC_DUMP in kept:
            self.config_checked = True
            self.first(kept)
        if self.first is not None and member.name == GPU_MANIFEST:
            parse_manifest(kept[GPU_MANIFEST], f"{self.path}:{GPU_MANIFEST}")
        return moved_bytes

    def end(self, trailer: Sequence[tuple[str, bytes]]) -> None:
        if self.out is not None:
            for name, trailing in trailer:
                self.written += write_small_entry(self.out, name, trailing)
            tarstream.write_end(self.out, self.written)


@dataclass(frozen=True)
class NestedChecks:
    """An import's checks of what is inside the archive's entries (oci.nested_tar)."""

    allow_setuid: bool = False


class _Both:
    """Two watchers of one entry's data."""

    def __init__(self, first: ByteSink, second: ByteSink) -> None:
        self.first, self.second = first, second

    def write(self, chunk: Data) -> None:
        self.first.write(chunk)
        self.second.write(chunk)


class _DeletedFiles:
    """deleted.files, collected as it passes (bounded at its header) and parsed at its end."""

    def __init__(self, where: str) -> None:
        self.where, self.data = where, bytearray()

    def write(self, chunk: Data) -> None:
        self.data += chunk

    def finish(self) -> None:
        parse_deleted_files(bytes(self.data), self.where)


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
        self._hashed: HashingWriter | None = None
        self._zstd: zstandard.ZstdCompressionWriter | None = None
        self.dir_fd = open_directory(os.path.dirname(path) or ".")

    def layer(self) -> zstandard.ZstdCompressionWriter:
        self._file = os.fdopen(create_private_at(self.dir_fd, f"{self.name}.partial"), "wb")
        self._hashed = HashingWriter(self._file)  # the archive's sha256, for its signature
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
            with suppress(FileNotFoundError):
                os.unlink(f"{self.name}.partial", dir_fd=self.dir_fd)
        self._close_directory()

    def _close_directory(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1
