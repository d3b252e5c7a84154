"""A checkpoint's memory pages staged beside podman's storage while podman imports the rest.

podman's `restore --import` reads an archive three times and untars it to disk itself; for
GiBs of pages that untar is most of the import. `gpuckpt import` instead writes the pages
files (`checkpoint/pages-N.img`) itself, once, as it checks the archive, into a root-only
directory on the filesystem of podman's storage, and gives podman the rest (a few MiB) with a
placeholder naming a random token. When podman then calls gpuckpt-runtime to restore, the shim
finds the placeholder in the image directory, looks the token up in its root-only state
directory, and renames the staged pages into place before CRIU runs.

Nothing is staged before the archive's config.dump and spec.dump are checked, and nothing past
the operator's bounds (transfer.bounds): each pages file's declared size is taken from the
budget before it is reserved (fallocate), every other byte before it is written.

The container's changed files (`rootfs-diff.tar`), its deletions (`deleted.files`), its
/dev/shm (`devshm-checkpoint.tar`) and its named volumes (`volumes/NAME.tar`) are staged too and
never given to podman, which would unpack them as root with its own tar reader, following links
out of where they go (podman 4.3): the shim applies them, each inside its own directory
(host/rooted.py, transfer/root_files.py). A restore with --ignore-rootfs (or --ignore-volumes) stages no
diff or deletions (no volume content): checked as they pass, dropped, so the shim applies none of them.

Only the shim's own record, written by `gpuckpt import` as root, says where pages come from: an
archive that carries a placeholder is refused on reading, and a token with no record fails the
restore with one line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import re
import secrets
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationError

from ..errors import ImageError
from ..host.safefiles import read_bounded, replace_file
from ..node.paths import state_dir
from ..oci.image_names import PAGES_FILE
from ..oci.image_names import STAGING_PLACEHOLDER as PLACEHOLDER
from ..oci.nested_tar import DELETED_FILES, DEVSHM, ROOTFS_DIFF, VOLUME_NAME, volume_of
from ..oci.podman_archive import PodmanConfigDump, volume_directory
from ..oci.tarstream import ByteSink, Data
from ..oci.timestamps import utc_now
from .bounds import StagedFile, StagingBudget

# anchored: pydantic's pattern searches, and the token names a file (an archive's placeholder carries it)
TOKEN_PATTERN = r"^[0-9a-f]{32}$"
MAX_RECORD_BYTES = 1 << 20
LIGHT_ARCHIVE = "archive.tar"  # what podman imports: everything but the pages
HELD_BYTES = 64 << 20  # before the config: podman's default /dev/shm size, which devshm-checkpoint.tar holds
# staged for the shim to apply inside the container's root, its /dev/shm and its volumes
ROOT_FILE = rf"rootfs-diff\.tar|deleted\.files|devshm-checkpoint\.tar|volumes/{VOLUME_NAME}\.tar"


EMPTY_TAR = bytes(10 * 1024)  # the end blocks, padded to tar's record: no entry


def staged_name(entry: str) -> str:
    """The file an archive entry is staged as (one directory, no '/')."""
    return entry.replace("/", "-")


class Placeholder(BaseModel):
    kind: Literal["gpuckpt-staged-import"] = "gpuckpt-staged-import"
    token: str = Field(pattern=TOKEN_PATTERN)


class StagedImport(BaseModel):
    """The shim's record of one staging: where the pages wait, and which."""

    token: str = Field(pattern=TOKEN_PATTERN)
    pages_dir: str
    pages: list[str]
    created: str
    root_files: list[Annotated[str, Field(pattern=f"^({ROOT_FILE})$")]] = []  # staged in pages_dir for the shim
    volume_destinations: dict[Annotated[str, Field(pattern=f"^{VOLUME_NAME}$")], str] = {}  # config.dump's
    volume_directories: dict[Annotated[str, Field(pattern=f"^{VOLUME_NAME}$")], str] = {}  # this node's podman's
    storage: str = ""  # podman's graph root: where the container's /dev/shm directory must be
    allow_setuid_files: bool = False  # what the diff was checked with (oci.nested_tar), checked again with
    vouched: str = ""  # what verified the archive (its signer, or the trust policy's unsigned exception)
    standby: bool = False  # `gpuckpt restore --standby` (root): the shim leaves the GPU state in host memory


@dataclass(frozen=True)
class ClaimedImport:
    """What a staged import left for the shim: the pages moved into the image, and the files it applies
    to the container's root itself (paths in the staging directory; None where the archive had none)."""

    pages: list[str]
    root_files: dict[str, str]  # archive entry -> its staged file
    volume_destinations: dict[str, str]  # volume name -> where the container mounts it
    volume_directories: dict[str, str]  # volume name -> the directory this node's podman makes for it
    storage: str  # podman's graph root (its containers' /dev/shm directories are below it)
    allow_setuid_files: bool = False
    vouched: str = ""  # for a dump the archive carried unsigned (trust.dump_signature.verify_dump)
    standby: bool = False  # a standby restore was asked for by root (gpuckpt restore --standby)


def _records_dir() -> str:
    return os.path.join(state_dir(), "imports")


def _record_path(token: str) -> str:
    """The record of `token`, in the root-only records directory and nowhere else."""
    if not re.fullmatch(TOKEN_PATTERN, token):
        raise ImageError(f"{token[:80]!r} is not a staged import's token")
    return os.path.join(_records_dir(), f"{token}.json")


class Staging:
    """One import's staged files (used by `gpuckpt import`), every byte taken from `budget` before
    it is written or reserved; the directory is made on first use, once the archive's config is
    checked (or to hold more than HELD_BYTES before it); remove() leaves nothing behind."""

    def __init__(self, near: str, budget: StagingBudget, allow_setuid_files: bool = False) -> None:
        self.near, self.budget, self.allow_setuid_files = near, budget, allow_setuid_files
        self.token = secrets.token_hex(16)
        self.directory = ""
        self.active = False  # the pages are staged here (the restore goes through the shim)
        self.pages: list[str] = []
        self.root_files: list[str] = []
        self.volume_destinations: dict[str, str] = {}  # from the checked config.dump
        self.volume_directories: dict[str, str] = {}  # where this node's podman makes each volume
        self.storage = ""  # podman's graph root
        # what podman gets at the end of the rest: the placeholder, and an empty tar for each volume and
        # /dev/shm staged here (podman 4.3 fails an import that lacks a volume's tar)
        self.trailer: list[tuple[str, bytes]] = [self.placeholder()]
        self.vouched = ""  # set once the archive is verified (its signer, or the policy's unsigned exception)
        self.standby = False  # restore into standby (shim/restore.py reads it from the record)
        self.recorded = False
        self.ignore_rootfs = self.ignore_volumes = False  # podman's restore told so: those entries not staged
        self._dir_fd = -1
        self._light: StagedFile | None = None

    def _create(self, name: str) -> int:
        """A new root-only file in the staging directory (made now if need be), for writing."""
        if not self.directory:
            self.directory = tempfile.mkdtemp(prefix=".gpuckpt-import-", dir=self.near)  # 0700
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                       dir_fd=self._dir_fd)

    def start(self) -> None:
        """The archive's config is checked and restores through the shim: stage its pages here."""
        self.active = True

    def place_volumes(self, config: PodmanConfigDump, graph_root: str) -> None:
        """Where the container's volumes and /dev/shm are on this node's podman (its storage at `graph_root`):
        what the shim may write their content into."""
        self.storage = graph_root
        self.volume_destinations = {volume.volumeName: volume.dest.rstrip("/") or "/"
                                    for volume in config.namedVolumes}
        self.volume_directories = {volume.volumeName: volume_directory(graph_root, volume.volumeName)
                                   for volume in config.namedVolumes}

    def light(self) -> StagedFile:
        """The archive podman gets (all but the pages, and the placeholder), made on first use."""
        if self._light is None:
            self._light = StagedFile(os.fdopen(self._create(LIGHT_ARCHIVE), "wb"), self.budget,
                                     "the rest of the archive")
        return self._light

    @property
    def light_path(self) -> str:
        return os.path.join(self.directory, LIGHT_ARCHIVE)

    def close_light(self) -> None:
        if self._light is not None:
            self._light.out.close()

    def divert(self, member: tarfile.TarInfo) -> ParallelFile | _Dropped | None:
        """A file for a pages image's data or a root file's (closed by the copy), None for any other
        entry; pages before start() (the check alone), a stream that drops them. A root file is staged
        whenever it comes (podman writes devshm-checkpoint.tar before config.dump), within the budget."""
        directory, _, name = member.name.rpartition("/")
        volume = volume_of(member.name) is not None
        if (self.ignore_rootfs and member.name in (ROOTFS_DIFF, DELETED_FILES)) or (self.ignore_volumes and volume):
            if volume:
                self.trailer.append((member.name, EMPTY_TAR))  # as for a staged volume: podman 4.3 wants its tar
            return _Dropped()  # checked as it passes; podman was told to leave it out, so the shim gets none
        if member.name in (ROOTFS_DIFF, DELETED_FILES, DEVSHM) or volume:
            name = staged_name(member.name)
            self.root_files.append(member.name)
            if member.name == DEVSHM or volume:
                self.trailer.append((member.name, EMPTY_TAR))
        elif directory != "checkpoint" or not PAGES_FILE.fullmatch(name):
            return None
        elif not self.active:
            return _Dropped()
        else:
            self.pages.append(name)
        self.budget.take(member.name, member.size)  # checked before a byte is reserved for it
        fd = self._create(name)
        try:
            if member.size:
                os.posix_fallocate(fd, 0, member.size)  # a full disk fails here, not after GiBs
        except OSError:
            os.close(fd)
            raise
        return ParallelFile(fd)

    def placeholder(self) -> tuple[str, bytes]:
        return f"checkpoint/{PLACEHOLDER}", Placeholder(token=self.token).model_dump_json().encode()

    def record(self) -> None:
        os.makedirs(_records_dir(), mode=0o700, exist_ok=True)
        record = StagedImport(token=self.token, pages_dir=self.directory, pages=self.pages,
                              created=utc_now(), root_files=self.root_files,
                              volume_destinations=self.volume_destinations,
                              volume_directories=self.volume_directories, storage=self.storage,
                              allow_setuid_files=self.allow_setuid_files, vouched=self.vouched,
                              standby=self.standby)
        replace_file(_record_path(self.token), record.model_dump_json())
        self.recorded = True

    def remove(self) -> None:
        if self.recorded:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_record_path(self.token))
        if self._light is not None:
            with contextlib.suppress(OSError):  # already failing: that error is the one reported
                self._light.out.close()
            self._light = None
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory, self.active = "", False


class _Dropped:
    def write(self, data: Data) -> int:
        return len(data)

    def __enter__(self) -> _Dropped:
        return self

    def __exit__(self, *failure: object) -> None:
        pass


class HeldOutput:
    """What copy_checked writes before the archive's config is checked (podman writes
    devshm-checkpoint.tar first): held in memory up to HELD_BYTES, past which it goes on to
    `spill()`'s stream; then `release(target)` sends it on to `target`, or drops it (None)."""

    def __init__(self, spill: Callable[[], ByteSink], limit_bytes: int = 0) -> None:
        self.spill, self.limit_bytes = spill, limit_bytes or HELD_BYTES
        self.held, self.released = bytearray(), False
        self.target: ByteSink | None = None

    def write(self, data: Data) -> int:
        if self.target is not None:
            self.target.write(data)
        elif not self.released:
            self.held += data
            if len(self.held) > self.limit_bytes:
                self.target = self.spill()
                self.target.write(self.held)
                self.held = bytearray()
        return len(data)

    def release(self, target: ByteSink | None) -> None:
        if target is not None and self.target is None:
            target.write(self.held)
        self.held, self.target, self.released = bytearray(), target, True


class ParallelFile:
    """A new file written sequentially by its caller and stored by one thread per usable CPU (at most 8).

    Most of a staging's time is the kernel's, not ours: every page of a new file takes a fresh
    page-cache page (in a VM whose balloon hands freed memory back to the host, also a fault
    there: 2.5 s per GB on the CI VM). One writing thread takes those on one CPU; these take
    them on all of them while the (single-threaded) decompression goes on. Takes `fd`."""

    CHUNK_BYTES = 1 << 20

    def __init__(self, fd: int, threads: int = 0) -> None:
        self.fd, self.offset = fd, 0
        threads = threads or min(len(os.sched_getaffinity(0)), 8)  # each holds 2 MiB of buffers
        self._free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(2 * threads):
            self._free.put(bytearray(self.CHUNK_BYTES))
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="gpuckpt-stage")
        self._pending: list[Future[None]] = []

    def write(self, data: Data) -> int:
        view = memoryview(data)
        while view:
            buffer = self._free.get()  # at most 2 chunks per thread in flight
            count = min(len(view), len(buffer))
            buffer[:count] = view[:count]
            self._pending.append(self._pool.submit(self._store, buffer, count, self.offset))
            self.offset += count
            view = view[count:]
            while self._pending and self._pending[0].done():
                self._pending.pop(0).result()  # a failed write fails the copy here
        return len(data)

    def _store(self, buffer: bytearray, count: int, offset: int) -> None:
        try:
            view = memoryview(buffer)[:count]
            while view:
                written = os.pwrite(self.fd, view, offset)
                view, offset = view[written:], offset + written
        finally:
            self._free.put(buffer)

    def close(self) -> None:
        if self.fd < 0:
            return
        try:
            for future in self._pending:
                future.result()
        finally:
            self._pool.shutdown(cancel_futures=True)
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ParallelFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            self.close()
        except Exception:
            if kind is None:
                raise
            # already failing: that error is the one to report


def claim_staged(image_dir: str) -> ClaimedImport | None:
    """Move pages staged by `gpuckpt import` into the image directory; what was staged.

    Nothing to do (and one stat) when the image holds no placeholder."""
    marker = os.path.join(image_dir, PLACEHOLDER)
    if not os.path.lexists(marker):
        return None
    try:
        token = Placeholder.model_validate_json(read_bounded(marker, 4096, marker)).token
    except ValidationError:
        raise ImageError(f"{marker}: not a gpuckpt import placeholder") from None
    record_path = _record_path(token)
    if not os.path.exists(record_path):
        raise ImageError(f"{image_dir}: its memory pages were staged by a gpuckpt import that has ended; "
                         "import the archive again")
    try:
        record = StagedImport.model_validate_json(read_bounded(record_path, MAX_RECORD_BYTES, record_path))
    except ValidationError as error:
        raise ImageError(f"{record_path}: not a valid staged import record: {str(error).splitlines()[0]}") from None
    for name in record.pages:
        if not PAGES_FILE.fullmatch(name):
            raise ImageError(f"{record_path}: {name!r} is not a pages image name")
        target = os.path.join(image_dir, name)
        if os.path.lexists(target):
            raise ImageError(f"{image_dir}: {name} is both in the image and staged")
        staged = os.path.join(record.pages_dir, name)
        try:
            os.rename(staged, target)
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise ImageError(f"{image_dir}: cannot move the staged {name}: {error.strerror}") from None
            # not the storage's filesystem after all. Not a symlink: CRIU opens pages images
            # after entering the container's mount namespace, where the link would not resolve.
            shutil.copyfile(staged, target, follow_symlinks=False)
    os.unlink(marker)
    root_files = {name: os.path.join(record.pages_dir, staged_name(name)) for name in record.root_files}
    return ClaimedImport(record.pages, root_files, record.volume_destinations, record.volume_directories,
                         record.storage, record.allow_setuid_files, record.vouched, record.standby)
