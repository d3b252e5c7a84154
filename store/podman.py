"""A podman container's checkpoint into the store, and back out of it, through podman.

Into the store: podman checkpoints the container (through gpuckpt-runtime when that is its runtime)
and writes its export, uncompressed, into a private FIFO, as `gpuckpt export` has it do; every entry
is checked as it passes (oci.podman_archive.copy_checked) and its files chunked into the store
(store.writer), under the store's shared lock, the manifest last.

Out of it: the checkpoint's manifest read, every chunk it names looked up (a missing one is named
before anything is read), its config checked as `gpuckpt import` checks an archive's; then the
stored stream (store.reader: every chunk verified) goes through the same checked copy as an import:
the pages staged for the shim, the rest into the archive podman imports. podman runs only after the
last chunk has been verified: a corrupt chunk refuses the restore, naming it. Export writes the
same stream into a signed archive or checkpoint image, as `gpuckpt export` signs.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from ..errors import ImageError, UsageError
from ..host.fifo import open_when_peer, private_fifo, widen
from ..host.process import Background, run
from ..host.programs import find_program
from ..host.signals import termination_deferred
from ..node.config import load_config
from ..node.engines import RUNTIME_NAME, own_hook_paths
from ..node.podman_storage import podman_storage
from ..node.put_back import put_back, raise_with_outcome, require_container
from ..oci.image_layout import CheckpointImageWriter, parse_target
from ..oci.podman_archive import (
    CONFIG_DUMP,
    MAX_DUMP_BYTES,
    SPEC_DUMP,
    ArchiveWriter,
    NestedChecks,
    copy_checked,
    described,
    described_dumps,
)
from ..policy.archive_import import import_refusals
from ..policy.image import check_archive
from ..transfer.bounds import StagingBudget
from ..transfer.restore_options import RestoreOptions, refuse_as_config_says
from ..transfer.staging import Staging
from ..trust.keys import require_node_key
from ..trust.provenance import ExportSigning
from .manifest import StoredCheckpoint, check_name
from .reader import StoredStream, entry_bytes, missing_chunks
from .repository import Store
from .writer import CheckpointWriter

# What shows a long pass to a person (cli.progress's bars): (what, total bytes) -> a context whose value
# hears of the bytes done so far; the default shows nothing.
Progress = Callable[[str, int | None], AbstractContextManager[Callable[[int], None] | None]]


def _quiet(what: str, total: int | None) -> AbstractContextManager[Callable[[int], None] | None]:
    return nullcontext()


def podman() -> str:
    found = find_program("podman")
    if found is None:
        raise UsageError("podman is not installed (the store checkpoints and restores podman containers)")
    return found


def default_name(store: Store, container: str) -> str:
    """CONTAINER-YYYYmmddTHHMMSSZ (and -2, -3… within one second), allow-listed characters only."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", container)[:100].lstrip("_.-") or "checkpoint"
    base = f"{base}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    name, number = base, 1
    while store.has_checkpoint(name):
        number += 1
        name = f"{base}-{number}"
    return name


def checkpoint_into(store: Store, container: str, name: str | None, flags: list[str], *, threads: int = 0,
                    progress: Progress = _quiet) -> StoredCheckpoint:
    """podman's checkpoint of `container` (with podman's `flags`), chunked into the store as `name`.
    Failed or interrupted, the container is put back (node/put_back.py) and the chunks it wrote removed."""
    if name is not None and store.has_checkpoint(check_name(name)):
        raise UsageError(f"a checkpoint named {name!r} is already in {store.root}: give another --name")
    program = podman()
    require_container(program, container)
    what = f"podman's export of {container}"
    writer = CheckpointWriter(store, threads)
    with private_fifo("gpuckpt-store-") as fifo:
        # its own process group: a Ctrl-C reaches us only, and podman is wound down in order (put_back)
        podman_run = Background([program, "container", "checkpoint", "--export", fifo, "--compress", "none",
                                 *flags, container], own_group=True)
        podman_waited = False
        try:
            with store.locked():
                fd = open_when_peer(fifo, writing=False, peer_alive=podman_run.running)
                kept: dict[str, bytes] = {}
                if fd is not None:
                    widen(fd)
                    with os.fdopen(fd, "rb", buffering=0) as stream, progress(f"storing {container}", None) as moved:
                        copied = copy_checked(stream, None, what, progress=moved, kept=kept, observe=writer.observe)
                podman_waited = True
                podman_run.wait(check=True)
                if fd is None:
                    raise UsageError(f"podman finished without writing the checkpoint of {container}")
                archive = described(what, kept, copied.names, copied.files, copied.bytes)
                return writer.commit(name or default_name(store, archive.config.name), archive.config.name,
                                     archive.config.id)
        except BaseException as failure:  # noqa: BLE001 -- every failure, Ctrl-C too, puts it back; re-raised
            writer.discard()
            put = put_back(program, container, podman_run, fifo, tcp_established="--tcp-established" in flags,
                           command="store")
            removed = writer.remove_written()  # the shared lock let go: now no other writer counts on them
            outcome = "no checkpoint stored" + (f", {removed}" if removed else "") + (f"; {put}" if put else "")
            raise_with_outcome("store", failure, outcome, store.root, podman_run=podman_run,
                               podman_waited=podman_waited)


def _readable(store: Store, name: str) -> tuple[StoredCheckpoint, str]:
    """The checkpoint's manifest, every chunk it names present (the first missing one named)."""
    stored = store.read_checkpoint(name)
    what = f"{store.root}: checkpoint {name}"
    if missing := missing_chunks(store, stored):
        raise ImageError(f"{what}: {len(missing)} of its chunks are missing from the store (chunk {missing[0]}"
                         f"{' and others' if len(missing) > 1 else ''}): refused (gpuckpt store verify lists them)")
    return stored, what


@dataclass
class Restored:
    container: str  # the name config.dump gives it
    podman_line: str  # podman's last line: the new container's ID
    phases: list[str]


def restore_from(store: Store, name: str, options: RestoreOptions, *, trust_config: bool = False, threads: int = 0,
                 progress: Progress = _quiet, standby: bool = False) -> Restored:
    """The stored checkpoint `name` restored by podman with `options` (checked: RestoreOptions.check); `standby`:
    the shim leaves its CUDA processes' state in host memory (shim/restore.py)."""
    program = podman()
    limits = load_config().import_
    started = time.monotonic()
    staging: Staging | None = None
    try:
        with store.locked():  # held while chunks are read: not through podman's restore
            stored, what = _readable(store, name)
            small = {entry: entry_bytes(store, stored, entry, MAX_DUMP_BYTES) for entry in (CONFIG_DUMP, SPEC_DUMP)}
            if None in small.values():
                raise ImageError(f"{what}: not a podman checkpoint: no {CONFIG_DUMP} or {SPEC_DUMP}")
            dumps = described_dumps(what, {entry: data for entry, data in small.items() if data is not None})
            refuse_as_config_says(program, what, dumps.config, options)  # before podman's slow `info`
            storage = podman_storage(program)
            graph_root, run_root, near = storage.graph_root, storage.run_root, storage.staging_parent
            rewrite, move = options.rewrites(RUNTIME_NAME)
            if move is not None:  # planned (or refused) before a chunk is staged
                move.config(small[CONFIG_DUMP] or b"")
            if not trust_config and (refusals := import_refusals(dumps, own_hook_paths(), run_root,
                                                                 graph_root=graph_root)):
                raise ImageError(f"{what}: its container config asks for {'; '.join(refusals)}: refused "
                                 "(give --trust-config if you trust it)")
            # this node's own container's files: setuid ones it had are its own, every other rule holds
            staging = Staging(near, StagingBudget(what, near, limits), allow_setuid_files=True)
            staging.ignore_rootfs, staging.ignore_volumes = options.ignore_rootfs, options.ignore_volumes
            staging.place_volumes(dumps.config, graph_root)
            staging.start()  # pages and root files beside podman's storage for the shim; podman imports the rest
            kept: dict[str, bytes] = {}
            with progress(f"restoring {name}", stored.logical_bytes) as moved:
                copied = copy_checked(StoredStream(store, stored, threads), staging.light(), what,
                                      progress=moved, kept=kept, divert=staging.divert,
                                      trailer=staging.trailer, nested=NestedChecks(allow_setuid=True),
                                      rewrite=rewrite)
        staging.close_light()
        checked = described(what, kept, copied.names, copied.files, copied.bytes)
        check_archive(staging.light_path, checked.spec_bytes, what)  # CRIU's images against spec.dump
        phases = [f"{stored.logical_bytes / 2**20:.0f} MiB read and verified in {time.monotonic() - started:.1f} s"]
        if move is not None:
            phases.append(f"onto {move.summary()}")
        staging.vouched = f"stored checkpoint {name} on this node, every chunk verified"
        staging.standby = standby
        staging.record()  # from here the shim may take the pages
        podman_started = time.monotonic()
        with termination_deferred():  # podman killed mid-restore could leave the container half made
            finished = run([program, "container", "restore", f"--import={staging.light_path}", *options.flags()],
                           timeout_s=3600)
        phases.append(f"podman's restore {time.monotonic() - podman_started:.1f} s")
    finally:
        if staging is not None:
            staging.remove()
    line = (finished.stdout.strip().splitlines() or [checked.config.name])[-1]
    return Restored(checked.config.name, line, phases)


def export_from(store: Store, name: str, output: str, threads: int = 0,
                progress: Progress = _quiet) -> tuple[str, str, int]:
    """The stored checkpoint as a signed podman archive (or `oci:DIR[:TAG]` image); where, its signature
    and its logical bytes."""
    signing = ExportSigning(require_node_key())  # no key: refused before anything is written
    image = parse_target(output)
    writer: CheckpointImageWriter | ArchiveWriter
    if image is not None:
        writer, where = CheckpointImageWriter(*image, threads=threads), f"oci:{image[0]}:{image[1]}"
    else:
        where = os.path.abspath(output)
        if not os.path.isdir(os.path.dirname(where)):
            raise UsageError(f"{output}: no such directory {os.path.dirname(where)}")
        if os.path.isdir(where):
            raise UsageError(f"{output}: is a directory; give a file, or oci:{output} for an image layout")
        writer = ArchiveWriter(where, threads)
    signing.attach(writer)
    try:
        with store.locked():
            stored, what = _readable(store, name)
            kept: dict[str, bytes] = {}
            with progress(f"exporting {name}", stored.logical_bytes) as moved:
                copied = copy_checked(StoredStream(store, stored, threads), writer.layer(), what, progress=moved,
                                      kept=kept, observe=signing.observe)
        writer.finish(described(where, kept, copied.names, copied.files, copied.bytes))
        signed = signing.finish(writer)
    except BaseException:
        writer.discard()
        raise
    return where, signed, stored.logical_bytes
