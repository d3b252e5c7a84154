"""`gpuckpt export` / `gpuckpt import`: a podman container's checkpoint as one archive, and back.

Export: podman checkpoints the container (through gpuckpt-runtime, if that is its runtime)
and writes its archive, uncompressed, into a FIFO; gpuckpt checks every entry and compresses
the stream with multithreaded zstd into the archive (0600: it holds process memory). No
uncompressed copy touches the disk. The result is podman's own layout: `podman container
restore --import` and checkpointctl read it.

Import: the archive is read and checked once (entries, sizes, config.dump, spec.dump, the
GPU manifest) before podman sees anything; config.dump and spec.dump are checked as soon as
they are read, before anything is staged, and nothing is staged past the operator's bounds
(transfer.bounds). Through gpuckpt-runtime the pages are staged for the shim and podman
imports the rest (transfer.staging); otherwise the archive is read again, re-checked entry
by entry, and written compressed beside podman's storage for podman's `restore --import`.
"""

from __future__ import annotations

import argparse
import os
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from ..errors import ImageError, UsageError
from ..host.direct_read import file_kind
from ..host.fifo import open_when_peer, private_fifo, widen
from ..host.process import Background, run
from ..host.programs import find_program
from ..node.config import ImportConfig, load_config
from ..node.engines import own_hook_paths
from ..oci.archive import READ_BYTES, RatioGuard, decompressed, open_archive
from ..oci.image_layout import CheckpointImageWriter, parse_target
from ..oci.podman_archive import ArchiveWriter, copy_checked, described, described_dumps, exported_bytes
from ..policy.archive_import import import_refusals
from ..policy.image import check_archive
from ..transfer.bounds import StagingBudget
from ..transfer.staging import HeldOutput, Staging
from ..trust.keys import load_trust, require_node_key
from ..trust.provenance import ArchiveVerification, ExportSigning, Unsigned, verify_archive_signature
from .progress import byte_bar, moved_to, watched
from .signals import termination_deferred

if TYPE_CHECKING:
    import tarfile

    from ..oci.podman_archive import Copied, PodmanArchive
    from ..oci.tarstream import ByteSink, ByteSource


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = commands.add_parser("export", help="checkpoint a podman container into an archive")
    export.add_argument("container", help="podman container name or ID")
    export.add_argument("-o", "--output", required=True,
                        help="archive to write (.tar.zst), or oci:DIR[:TAG] for a checkpoint image layout")
    export.add_argument("--leave-running", action="store_true", help="keep the container running")
    export.add_argument("--tcp-established", action="store_true", help="checkpoint established TCP connections")
    export.add_argument("--threads", type=int, default=0, help="compression threads (default: one per CPU)")
    export.set_defaults(handler=run_export)
    restore = commands.add_parser("import", help="restore a podman container from an archive (ours or podman's)")
    restore.add_argument("archive", help="an archive written by gpuckpt export or podman checkpoint --export")
    restore.add_argument("--name", help="name of the restored container (default: the checkpointed one's)")
    restore.add_argument("--tcp-established", action="store_true", help="restore established TCP connections")
    restore.add_argument("--trust-config", action="store_true",
                         help="restore even if the archive's container config has OCI hooks, privilege, added "
                              "capabilities, host bind mounts or a runtime path (podman's own --import trusts them)")
    restore.add_argument("--signature", metavar="FILE", help="the archive's signature (default: ARCHIVE.sig)")
    restore.set_defaults(handler=run_import)


def _podman() -> str:
    podman = find_program("podman")
    if podman is None:
        raise UsageError("podman is not installed (export and import work on podman containers)")
    return podman


def _bundle(podman: str, container: str) -> str | None:
    """The directory podman's export of `container` reads (its bundle: beside config.json), or None
    where podman does not say (then the export's progress has no total)."""
    inspected = run([podman, "container", "inspect", "--format", "{{.OCIConfigPath}}", container], check=False)
    config_path = inspected.stdout.strip()
    return os.path.dirname(config_path) if inspected.returncode == 0 and os.path.isabs(config_path) else None


def _ended_within(program: Background, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while program.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not program.running()


def _writer(output: str, threads: int) -> tuple[CheckpointImageWriter | ArchiveWriter, str]:
    image = parse_target(output)
    if image is not None:
        return CheckpointImageWriter(*image, threads=threads), f"oci:{image[0]}:{image[1]}"
    path = os.path.abspath(output)
    if not os.path.isdir(os.path.dirname(path)):
        raise UsageError(f"-o {output}: no such directory {os.path.dirname(path)}")
    if os.path.isdir(path):
        raise UsageError(f"-o {output}: is a directory; give a file, or oci:{output} for an image layout")
    return ArchiveWriter(path, threads), path


def run_export(options: argparse.Namespace) -> int:
    podman = _podman()
    if options.threads < 0:
        raise UsageError(f"--threads {options.threads}: give 0 (one per CPU) or more")
    signing = ExportSigning(require_node_key())  # no key: refused before podman checkpoints
    writer, where = _writer(options.output, options.threads)
    signing.attach(writer)
    flags = [flag for flag, wanted in (("--leave-running", options.leave_running),
                                       ("--tcp-established", options.tcp_established)) if wanted]
    bundle = _bundle(podman, options.container) if watched() else None  # only a bar needs it
    started = time.monotonic()
    with private_fifo("gpuckpt-export-") as fifo:
        podman_run = Background([podman, "container", "checkpoint", "--export", fifo, "--compress", "none",
                                 *flags, options.container])
        try:
            fd = open_when_peer(fifo, writing=False, peer_alive=podman_run.running)
            if fd is not None:
                kept = dict[str, bytes]()
                widen(fd)
                with os.fdopen(fd, "rb", buffering=0) as stream:
                    copied = exported(stream, writer, options.container, bundle, kept=kept, observe=signing.observe)
            podman_run.wait(check=True)
            if fd is None:
                raise UsageError(f"podman finished without writing the archive of {options.container}")
            writer.finish(described(where, kept, copied.names, copied.files, copied.bytes))
            signed = signing.finish(writer)
        except ImageError as error:
            writer.discard()
            # a stream cut short is most often podman failing: then its message is the one to show
            if _ended_within(podman_run, 30):
                podman_run.wait(check=True)
            podman_run.kill()
            raise error
        except BaseException:
            podman_run.kill()
            writer.discard()
            raise
    print(f"exported {options.container} to {where}: {copied.bytes / 2**20:.0f} MiB of checkpoint, "
          f"{time.monotonic() - started:.1f} s, signed by key {signing.signer.key_id} ({signed})")
    return 0


def exported(stream: ByteSource, writer: CheckpointImageWriter | ArchiveWriter, container: str, bundle: str | None,
             *, kept: dict[str, bytes], observe: Callable[[tarfile.TarInfo], ByteSink | None] | None) -> Copied:
    """podman's export of `container` read from `stream` and re-emitted, checked, into `writer`.
    podman opens the stream once all it exports is written: their size in `bundle` is the bar's total."""
    with byte_bar(f"exporting {container}", exported_bytes(bundle) if bundle else None) as bar:
        return copy_checked(stream, writer.layer(), f"podman's export of {container}",
                            progress=lambda done: moved_to(bar, done), kept=kept, observe=observe)


def _require_archive_file(path: str) -> None:
    """The archive named is a regular file (a link to one is fine), before its signature is looked for: a
    directory or FIFO gave a bare "Is a directory" or "Illegal seek", and a FIFO nobody writes hung."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise ImageError(f"{path}: cannot read: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ImageError(f"{path}: not a regular file ({file_kind(mode)}): give the archive file itself")


def run_import(options: argparse.Namespace) -> int:
    """Staged when podman will restore through gpuckpt-runtime (the pages go beside podman's
    storage once, podman imports the rest); streamed through a FIFO otherwise. The archive's
    config is checked before anything is staged, and nothing is staged past the operator's
    bounds (transfer.bounds)."""
    _require_archive_file(options.archive)
    podman = _podman()
    limits = load_config().import_
    verification = verify_archive_signature(options.archive, load_trust(), options.signature)  # before any staging
    started = time.monotonic()
    flags = ["--name", options.name] if options.name else []
    flags += ["--tcp-established"] if options.tcp_established else []
    graph_root = run([podman, "info", "--format", "{{.Store.GraphRoot}}"]).stdout.strip()
    run_root = run([podman, "info", "--format", "{{.Store.RunRoot}}"]).stdout.strip()  # its pid files
    # beside podman's storage, on its filesystem, so the shim can rename the pages in (a copy otherwise)
    near = os.path.dirname(graph_root)
    if os.stat(near).st_dev != os.stat(graph_root).st_dev:
        near = graph_root  # the storage is a filesystem of its own
    staging = Staging(near, StagingBudget(options.archive, near, limits))
    held = HeldOutput(spill=staging.light)  # what comes before config.dump (podman: devshm-checkpoint.tar)

    def config_read(kept: dict[str, bytes]) -> None:
        """config.dump and spec.dump, checked before anything is staged; then where the rest goes."""
        dumps = described_dumps(options.archive, kept)
        if not options.trust_config and (refusals := import_refusals(dumps, own_hook_paths(), run_root)):
            raise ImageError(f"{options.archive}: its container config asks for {'; '.join(refusals)}: refused "
                             "(give --trust-config if you trust where the archive comes from)")
        if os.path.basename(dumps.config.runtime) == "gpuckpt-runtime":
            staging.start()  # the pages are staged; otherwise podman reads them from the archive
        held.release(staging.light())

    try:
        copied, kept, checked_file = checking_pass(options.archive, verification, held, staging, limits=limits,
                                                   config_read=config_read)
        staging.close_light()
        checked = described(options.archive, kept, copied.names, copied.files, copied.bytes)
        light = staging.light_path
        check_archive(light, checked.spec_bytes, options.archive)  # CRIU's images against spec.dump, trusted or not
        phases = [f"checked and staged in {time.monotonic() - started:.1f} s"]
        if staging.active:
            staging.record()  # from here the shim may take the pages
            with termination_deferred():  # podman killed mid-restore could leave the container half made
                finished = run([podman, "container", "restore", "--import", light, *flags], timeout_s=3600)
        else:
            phases = [f"checked in {time.monotonic() - started:.1f} s; runtime {checked.config.runtime}"]
            copy = _stage_checked_copy(checked, checked_file, staging, verification, limits=limits, phases=phases)
            staging.budget.take("the archive unpacked by podman", copied.bytes)
            with termination_deferred():
                finished = run([podman, "container", "restore", "--import", copy, *flags], timeout_s=3600)
    finally:
        staging.remove()
    restored = finished.stdout.strip().splitlines()[-1:] or [checked.config.name]
    print(f"restored {checked.config.name} as {restored[0][:12]} from {options.archive} in "
          f"{time.monotonic() - started:.1f} s ({', '.join(phases)})")
    return 0


def checking_pass(archive: str, verification: ArchiveVerification | Unsigned, held: HeldOutput, staging: Staging,
                  *, limits: ImportConfig, config_read: Callable[[dict[str, bytes]], None],
                  ) -> tuple[Copied, dict[str, bytes], tuple[int, ...]]:
    """The archive read once, every entry checked (config_read: config.dump and spec.dump, before
    anything is staged), the pages staged; what it held, its small files, and the identity of the
    file read. The bar counts the archive's own bytes as read: a compressed one's time left is true."""
    kept: dict[str, bytes] = {}
    with open_archive(archive) as raw:
        archive_bytes = os.fstat(raw.fileno()).st_size
        with byte_bar(f"importing {os.path.basename(archive)}", archive_bytes) as bar:
            copied = copy_checked(decompressed(verification.reader(raw)), held, archive,
                                  progress=lambda _: moved_to(bar, raw.tell()), kept=kept,
                                  divert=staging.divert, trailer=(staging.placeholder(),),
                                  observe=verification.observe, first=config_read,
                                  guard=RatioGuard(archive, raw.tell, limits.max_entry_ratio, READ_BYTES,
                                                   archive_bytes))
            verification.finish()
            moved_to(bar, raw.tell())
        return copied, kept, file_identity(os.fstat(raw.fileno()))  # the file this pass read and checked


def file_identity(status: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is replaced or written: device, inode, size, and the change time,
    which its owner cannot set back."""
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns


def _stage_checked_copy(checked: PodmanArchive, checked_file: tuple[int, ...], staging: Staging,
                        verification: ArchiveVerification | Unsigned, *, limits: ImportConfig,
                        phases: list[str]) -> str:
    """The archive read again, checked again (signature, bounds, no more than the checked pass
    held) and written compressed into the staging directory, which podman then imports as a
    file. A FIFO served podman 4.3's three opens, but podman >= 5.8.2 reads the first one to its
    end and waits, which a FIFO held open for the next pass never gives: a file serves both.
    The file must be the one the first pass checked, unchanged before and after this read: an
    unsigned archive's config is not checked again here."""
    pass_started = time.monotonic()
    staging.budget.take("the checked copy for podman", os.path.getsize(checked.path))  # about its size again
    writer = ArchiveWriter(os.path.join(staging.directory, CHECKED_COPY))
    try:
        with open(checked.path, "rb") as raw:
            _require_unchanged(raw, checked_file, checked.path)
            again = verification.again()  # the file is read anew: checked anew
            archive_bytes = os.fstat(raw.fileno()).st_size
            guard = RatioGuard(checked.path, raw.tell, limits.max_entry_ratio, READ_BYTES, archive_bytes)
            with byte_bar("copying for podman", archive_bytes) as bar:

                def moved(done: int) -> None:
                    _no_more_than(checked, done)
                    moved_to(bar, raw.tell())

                copy_checked(decompressed(raw), writer.layer(), checked.path, progress=moved,
                             observe=again.observe if again else None, guard=guard)
            if again:
                again.finish()
            _require_unchanged(raw, checked_file, checked.path)
        writer.finish(checked)
    except BaseException:
        writer.discard()
        raise
    phases.append(f"checked copy for podman in {time.monotonic() - pass_started:.1f} s")
    return writer.path


CHECKED_COPY = "checked-archive.tar.zst"


def _require_unchanged(raw: BinaryIO, checked_file: tuple[int, ...], path: str) -> None:
    if file_identity(os.fstat(raw.fileno())) != checked_file:
        raise ImageError(f"{path}: replaced or written since it was checked: refused")


def _no_more_than(checked: PodmanArchive, done: int) -> None:
    if done > checked.bytes:
        raise ImageError(f"{checked.path}: holds more than the {checked.bytes} bytes it held when checked: "
                         "changed since; refused")
