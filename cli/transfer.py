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
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import GpuckptError, ImageError, NotFoundError, UsageError
from ..host.direct_read import file_kind
from ..host.fifo import open_when_peer, private_fifo, widen
from ..host.process import Background, run
from ..host.programs import find_program
from ..node.config import ImportConfig, load_config
from ..node.container_record import container_label, short_id
from ..node.engines import PODMAN_CONF, RUNTIME_NAME, own_hook_paths, podman_registration
from ..node.paths import config_path
from ..node.podman_storage import podman_storage
from ..node.put_back import put_back, raise_with_outcome, require_container
from ..oci.archive import READ_BYTES, RatioGuard, decompressed, open_archive
from ..oci.image_layout import CheckpointImageWriter, parse_target, read_layout
from ..oci.podman_archive import (
    CONFIG_DUMP,
    SPEC_DUMP,
    ArchiveWriter,
    NestedChecks,
    copy_checked,
    described,
    described_dumps,
    exported_bytes,
    with_runtime,
)
from ..policy.annotations import refuse_runtime_annotations
from ..policy.archive_import import import_refusals, volume_refusals
from ..policy.image import check_archive
from ..transfer.bounds import StagingBudget
from ..transfer.gpu_move import GpuMove
from ..transfer.restore_options import (
    RestoreOptions,
    refuse_as_config_says,
    refuse_taken,
    require_pod,
    require_supported,
)
from ..transfer.staging import HeldOutput, Staging
from ..trust.keys import load_trust, require_node_key
from ..trust.provenance import (
    ArchiveVerification,
    ExportSigning,
    LayerVerification,
    Verification,
    verify_archive_signature,
    verify_image_signature,
)
from .output import ExportResult, ImportResult, size_text
from .progress import byte_bar, moved_to, watched
from .signals import termination_deferred

if TYPE_CHECKING:
    import tarfile

    from ..oci.podman_archive import Copied
    from ..oci.tarstream import ByteSink, ByteSource


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = commands.add_parser("export", help="checkpoint a podman container into an archive")
    export.add_argument("container", help="podman container name or ID")
    export.add_argument("-o", "--output", required=True,
                        help="archive to write (.tar.zst), or oci:DIR[:TAG] for a checkpoint image layout")
    export.add_argument("--leave-running", action="store_true", help="keep the container running")
    export.add_argument("--tcp-established", action="store_true", help="checkpoint established TCP connections")
    export.add_argument("--threads", type=int, default=0, help="compression threads (default: one per CPU)")
    export.add_argument("--json", action="store_true", help="the result as JSON (docs/cli-output.md)")
    export.set_defaults(handler=run_export)
    restore = commands.add_parser("import", help="restore a podman container from an archive (ours or podman's)")
    restore.add_argument("archive", help="an archive written by gpuckpt export or podman checkpoint --export, or "
                                         "oci:DIR[:TAG], a checkpoint image layout (gpuckpt export -o oci:...)")
    add_restore_options(restore)
    restore.add_argument("--trust-config", action="store_true",
                         help="restore even if the archive's container config has OCI hooks, privilege, added "
                              "capabilities, host bind mounts or a runtime path (podman's own --import trusts them)")
    restore.add_argument("--signature", metavar="FILE", help="the archive's signature (default: ARCHIVE.sig)")
    restore.add_argument("--json", action="store_true", help="the result as JSON (docs/cli-output.md)")
    restore.set_defaults(handler=run_import, standby=False)  # gpuckpt restore --standby sets it


def add_restore_options(parser: argparse.ArgumentParser, name_dest: str = "name") -> None:
    """podman's restore options (transfer/restore_options.py), for `import` and `store restore`."""
    parser.add_argument("--name", dest=name_dest, help="name of the restored container (default: the "
                        "checkpointed one's, and its ID)")
    parser.add_argument("--tcp-established", action="store_true", help="restore established TCP connections")
    parser.add_argument("-p", "--publish", action="append", default=[], metavar="[[IP:][HOST_PORT]:]PORT[/PROTO]",
                        help="publish a container port (or range) on the host, as podman restore --publish "
                             "(repeatable)")
    parser.add_argument("--pod", help="restore into this existing pod")
    parser.add_argument("--ignore-static-ip", action="store_true", help="ignore the IP address set by --ip")
    parser.add_argument("--ignore-static-mac", action="store_true", help="ignore the MAC address set by --mac-address")
    parser.add_argument("--keep", action="store_true", help="podman keeps its temporary checkpoint files (they "
                                                            "hold the process memory)")
    parser.add_argument("--ignore-rootfs", action="store_true",
                        help="leave out the container's changed files (rootfs-diff.tar, deleted.files)")
    parser.add_argument("--ignore-volumes", action="store_true", help="leave out the content of its named volumes")
    parser.add_argument("--gpu", action="append", default=[], metavar="KIND=NAME",
                        help="restore onto this node's CDI device instead of the checkpoint's (nvidia.com/gpu=2): "
                             "one for each GPU device it had, in order (repeatable; docs/archives.md)")


def restore_options(podman: str, options: argparse.Namespace, name: str | None) -> RestoreOptions:
    """podman's restore options as asked, checked (values, this podman's support, the pod, the name free)
    before anything is read or staged."""
    chosen = RestoreOptions(name=name, tcp_established=options.tcp_established, publish=tuple(options.publish),
                            pod=options.pod, ignore_static_ip=options.ignore_static_ip,
                            ignore_static_mac=options.ignore_static_mac, keep=options.keep,
                            ignore_rootfs=options.ignore_rootfs, ignore_volumes=options.ignore_volumes,
                            gpus=tuple(options.gpu))
    chosen.check()
    if name:  # first: what podman would refuse only after the whole archive is checked and staged
        refuse_taken(podman, name)
    require_supported(podman, chosen)
    return replace(chosen, pod_id=require_pod(podman, chosen.pod))


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
    require_container(podman, options.container)
    signing = ExportSigning(require_node_key())  # no key: refused before podman checkpoints
    writer, where = _writer(options.output, options.threads)
    signing.attach(writer)
    flags = [flag for flag, wanted in (("--leave-running", options.leave_running),
                                       ("--tcp-established", options.tcp_established)) if wanted]
    bundle = _bundle(podman, options.container) if watched() else None  # only a bar needs it
    started = time.monotonic()
    with private_fifo("gpuckpt-export-") as fifo:
        # its own process group: a Ctrl-C reaches us only, and podman is wound down in order (put_back)
        podman_run = Background([podman, "container", "checkpoint", "--export", fifo, "--compress", "none",
                                 *flags, options.container], own_group=True)
        podman_waited = False
        try:
            fd = open_when_peer(fifo, writing=False, peer_alive=podman_run.running)
            if fd is not None:
                kept = dict[str, bytes]()
                widen(fd)
                with os.fdopen(fd, "rb", buffering=0) as stream:
                    copied = exported(stream, writer, options.container, bundle, kept=kept, observe=signing.observe)
            podman_waited = True
            podman_run.wait(check=True)
            if fd is None:
                raise UsageError(f"podman finished without writing the archive of {options.container}")
            archive = described(where, kept, copied.names, copied.files, copied.bytes)
            writer.finish(archive)
            signed = signing.finish(writer)
        except BaseException as failure:  # noqa: BLE001 -- every failure, Ctrl-C too, puts it back; re-raised
            writer.discard()
            outcome = put_back(podman, options.container, podman_run, fifo, tcp_established=options.tcp_established)
            raise_with_outcome("export", failure, "no archive written" + (f"; {outcome}" if outcome else ""), where,
                               podman_run=podman_run, podman_waited=podman_waited)
    result = ExportResult(container=archive.config.name, container_id=archive.config.id,
                          short_id=short_id(archive.config.id), output=where, checkpoint_bytes=copied.bytes,
                          seconds=round(time.monotonic() - started, 3), key_id=signing.signer.key_id, signature=signed)
    result.emit(options.json, f"exported {container_label(result.container, result.container_id)} to {where}: "
                              f"{size_text(result.checkpoint_bytes)} of checkpoint, {result.seconds:.1f} s, signed by "
                              f"key {result.key_id} ({signed})" + ("" if options.leave_running else (
                                  f"; {result.container} is stopped (`podman container restore {result.container}` "
                                  "runs it again here)")))
    return 0


def exported(stream: ByteSource, writer: CheckpointImageWriter | ArchiveWriter, container: str, bundle: str | None,
             *, kept: dict[str, bytes], observe: Callable[[tarfile.TarInfo], ByteSink | None] | None) -> Copied:
    """podman's export of `container` read from `stream` and re-emitted, checked, into `writer`.
    podman opens the stream once all it exports is written: their size in `bundle` is the bar's total."""
    with byte_bar(f"exporting {container}", exported_bytes(bundle) if bundle else None) as bar:
        return copy_checked(stream, writer.layer(), f"podman's export of {container}",
                            progress=lambda done: moved_to(bar, done), kept=kept, observe=observe)


def require_archive_file(path: str) -> None:
    """The archive named is a regular file (a link to one is fine), before its signature is looked for: a
    directory or FIFO gave a bare "Is a directory" or "Illegal seek", and a FIFO nobody writes hung; a
    missing one gave "no signature"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None
    except OSError as error:
        raise ImageError(f"{path}: cannot read: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ImageError(f"{path}: not a regular file ({file_kind(mode)}): give the archive file itself")


def run_import(options: argparse.Namespace) -> int:
    """The archive is read once, every byte checked (config.dump and spec.dump before anything is
    staged, the tars inside and deleted.files as they pass), nothing staged past the operator's
    bounds (transfer.bounds). podman gets the rest of the archive with config.dump naming
    gpuckpt-runtime, whatever runtime the archive named: the shim's checks run at restore, it moves
    the staged pages in and applies the root filesystem diff and deletions inside the container's
    root (transfer.root_files); podman never sees them."""
    podman = _podman()
    restoring = restore_options(podman, options, options.name)  # a name taken: refused before anything is read
    _require_registered()
    config = load_config()
    limits = config.import_
    source, verification, vouched = _verified_source(options.archive, options.signature)  # before any staging
    started = time.monotonic()
    refuse_from_head(podman, source, options.archive, restoring)  # a name taken: before podman's slow `info`
    storage = podman_storage(podman)
    graph_root, run_root = storage.graph_root, storage.run_root
    near = storage.staging_parent
    staging = Staging(near, StagingBudget(options.archive, near, limits), limits.allow_setuid_files)
    staging.ignore_rootfs, staging.ignore_volumes = restoring.ignore_rootfs, restoring.ignore_volumes
    held = HeldOutput(spill=staging.light)  # what comes before config.dump (podman: devshm-checkpoint.tar)

    def config_read(kept: dict[str, bytes]) -> None:
        """config.dump and spec.dump, checked before anything is staged."""
        dumps = described_dumps(options.archive, kept)
        refuse_as_config_says(podman, options.archive, dumps.config, restoring)
        if not options.trust_config and (refusals := import_refusals(dumps, own_hook_paths(), run_root,
                                                                     graph_root=graph_root)):
            raise ImageError(f"{options.archive}: its container config asks for {'; '.join(refusals)}: refused "
                             "(give --trust-config if you trust where the archive comes from)")
        if refusals := volume_refusals(dumps.config, dumps.spec, graph_root):  # the import writes into them
            raise ImageError(f"{options.archive}: its container config asks for {'; '.join(refusals)}: refused")
        if dumps.spec is not None:  # what the shim refuses at restore, refused before podman makes anything
            refuse_runtime_annotations(dumps.spec.annotations, dumps.config.id[:12], config.criu, config_path())
        for volume in dumps.config.namedVolumes:  # podman would give the container this node's volume of that name
            if run([podman, "volume", "exists", volume.volumeName], check=False).returncode == 0:
                raise ImageError(f"{options.archive}: its container config names the volume {volume.volumeName}, "
                                 "which this node already has: refused (podman would give the container that "
                                 "volume and its data; remove or rename it first)")
        staging.place_volumes(dumps.config, graph_root)
        staging.start()
        held.release(staging.light())

    try:
        rewrite, move = restoring.rewrites(RUNTIME_NAME)
        copied, kept = checking_pass(source, verification, held, staging, limits=limits, config_read=config_read,
                                     what=options.archive, rewrite=rewrite)
        staging.close_light()
        checked = described(options.archive, kept, copied.names, copied.files, copied.bytes)
        check_archive(staging.light_path, checked.spec_bytes, options.archive)  # CRIU's images against spec.dump
        phases = _import_phases(started, checked.config.runtime, move)
        staging.vouched = f"gpuckpt import verified {options.archive}: {vouched}"
        staging.standby = options.standby
        staging.record()  # from here the shim may take the pages
        with termination_deferred():  # podman killed mid-restore could leave the container half made
            finished = run([podman, "container", "restore", f"--import={staging.light_path}", *restoring.flags()],
                           timeout_s=3600)
    finally:
        staging.remove()
    restored_id = (finished.stdout.strip().splitlines()[-1:] or [""])[0]  # podman's last line: the new ID
    result = ImportResult(archive=options.archive, container=options.name or checked.config.name,
                          container_id=restored_id, short_id=short_id(restored_id),
                          checkpointed_container=checked.config.name, seconds=round(time.monotonic() - started, 3),
                          provenance=vouched, phases=phases)
    # the name it has now (--name's, where given), as podman ps shows it
    state = " in standby (gpuckpt resume)" if options.standby else ""
    result.emit(options.json, f"restored {container_label(result.container, restored_id)}{state} from "
                              f"{options.archive} in "
                              f"{result.seconds:.1f} s ({', '.join(phases)})")
    return 0


def _import_phases(started: float, runtime: str, move: GpuMove | None) -> list[str]:
    """What the import did before podman's restore, for its one line."""
    phases = [f"checked and staged in {time.monotonic() - started:.1f} s"]
    if move is not None:
        phases.append(f"onto {move.summary()}")
    if runtime != RUNTIME_NAME:
        phases.append(f"the archive's runtime {runtime[:40] or 'default'!r} replaced by {RUNTIME_NAME}")
    return phases


HEAD_BYTES = 8 << 20  # how far into an archive's tar refuse_from_head looks for config.dump (past /dev/shm's files)


class _HeadRead(Exception):
    """refuse_from_head has read as far as it reads."""


def refuse_from_head(podman: str, source: str, what: str, restoring: RestoreOptions) -> None:
    """Without --name podman keeps the checkpointed container's name and ID: one already taken (or a pod asked
    for against the archive's) is refused from config.dump at the archive's head (after devshm-checkpoint.tar,
    within HEAD_BYTES), before podman's storage is asked and anything is staged (the trial of 2026-11-28 waited
    2.8 s for it, `podman info` most of it). The head is not verified yet: only a refusal comes of it, as
    `gpuckpt inspect` reads any archive; the checking pass decides everything else on verified bytes, and says
    what is wrong with an archive this read cannot take."""
    if restoring.name:
        return  # refused before anything was read (restore_options)
    kept: dict[str, bytes] = {}

    def dumps_read(_: dict[str, bytes]) -> None:
        raise _HeadRead

    def within_head(moved: int) -> None:  # counted as read out of the compression: no bomb costs more
        if moved > HEAD_BYTES:
            raise _HeadRead

    try:
        with open_archive(source) as raw:
            copy_checked(decompressed(raw), None, what, kept=kept, first=dumps_read, progress=within_head)
    except _HeadRead:
        pass
    except (GpuckptError, OSError):
        return
    if CONFIG_DUMP not in kept or SPEC_DUMP not in kept:
        return
    try:
        dumps = described_dumps(what, kept)
    except ImageError:
        return
    refuse_as_config_says(podman, what, dumps.config, restoring)


def _verified_source(target: str, signature: str | None) -> tuple[str, Verification, str]:
    """The file to read (an archive, or a checkpoint image's layer), how what is read is verified (an
    archive's signature, or the image manifest's signature and then its layer's digest), and by whom."""
    trust = load_trust()
    if (image := parse_target(target)) is not None:
        if signature:
            raise UsageError(f"--signature {signature}: a checkpoint image carries its signature in its manifest")
        layout = read_layout(*image)
        signed = verify_image_signature(layout.manifest, trust, target)
        by = f"signed by {signed[1]}" if signed else "unsigned, the trust policy allows restore:any"
        return layout.layer_path, LayerVerification(layout.layer.digest, target), by
    require_archive_file(target)
    verification = verify_archive_signature(target, trust, signature)
    by = (f"signed by {verification.signer_name}" if isinstance(verification, ArchiveVerification)
          else "unsigned, allowed by the trust policy")
    return target, verification, by


def _require_registered() -> None:
    """podman knows gpuckpt-runtime: the import names it in config.dump, and only through it are the staged
    files applied and the restore's checks run."""
    paths, _ = podman_registration()
    if not paths:
        raise UsageError(f"{RUNTIME_NAME} is not registered with podman ({PODMAN_CONF}): run `gpuckpt install "
                         "--engine podman` first; gpuckpt import restores through it")


def checking_pass(archive: str, verification: Verification, held: HeldOutput, staging: Staging,
                  *, limits: ImportConfig, config_read: Callable[[dict[str, bytes]], None], what: str = "",
                  rewrite: Mapping[str, Callable[[bytes], bytes]] | None = None) -> tuple[Copied, dict[str, bytes]]:
    """The archive read once, every entry checked (config_read: config.dump and spec.dump, before
    anything is staged; the tars inside and deleted.files), the pages and root files staged, config.dump
    given to podman naming gpuckpt-runtime (or as `rewrite` makes them); what it held and its small files. The
    bar counts the archive's own bytes as read: a compressed one's time left is true."""
    kept: dict[str, bytes] = {}
    what = what or archive
    with open_archive(archive) as raw:
        archive_bytes = os.fstat(raw.fileno()).st_size
        with byte_bar(f"importing {os.path.basename(what)}", archive_bytes) as bar:
            copied = copy_checked(decompressed(verification.reader(raw)), held, what,
                                  progress=lambda _: moved_to(bar, raw.tell()), kept=kept,
                                  divert=staging.divert, trailer=staging.trailer,
                                  observe=verification.observe, first=config_read,
                                  guard=RatioGuard(what, raw.tell, limits.max_entry_ratio, READ_BYTES,
                                                   archive_bytes),
                                  nested=NestedChecks(limits.allow_setuid_files),
                                  rewrite=rewrite if rewrite is not None else
                                  {CONFIG_DUMP: lambda data: with_runtime(data, RUNTIME_NAME)})
            verification.finish()
            moved_to(bar, raw.tell())
        return copied, kept
