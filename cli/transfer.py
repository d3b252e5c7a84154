"""`gpuckpt export` / `gpuckpt import`: a podman container's checkpoint as one archive, and back.

Export: podman checkpoints the container (through gpuckpt-runtime, if that is its runtime)
and writes its archive, uncompressed, into a FIFO; gpuckpt checks every entry and compresses
the stream with multithreaded zstd into the archive (0600: it holds process memory). No
uncompressed copy touches the disk. The result is podman's own layout: `podman container
restore --import` and checkpointctl read it.

Import: the archive is read and checked once (entries, sizes, config.dump, spec.dump, the
GPU manifest) before podman sees anything; then podman's `restore --import` reads a FIFO that
gpuckpt serves each time podman opens it (podman 4.3 opens it three times): config.dump and
spec.dump alone first, then the whole archive decompressed and re-checked entry by entry.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from gpuckpt.errors import UsageError


def add_parser(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser("export", help="checkpoint a podman container into an archive")
    export.add_argument("container", help="podman container name or ID")
    export.add_argument("-o", "--output", required=True, help="archive to write (.tar.zst)")
    export.add_argument("--leave-running", action="store_true", help="keep the container running")
    export.add_argument("--tcp-established", action="store_true", help="checkpoint established TCP connections")
    export.add_argument("--threads", type=int, default=0, help="compression threads (default: one per CPU)")
    export.set_defaults(handler=run_export)
    restore = commands.add_parser("import", help="restore a podman container from an archive (ours or podman's)")
    restore.add_argument("archive", help="an archive written by gpuckpt export or podman checkpoint --export")
    restore.add_argument("--name", help="name of the restored container (default: the checkpointed one's)")
    restore.add_argument("--tcp-established", action="store_true", help="restore established TCP connections")
    restore.set_defaults(handler=run_import)


class Progress:
    """Bytes moved, on a terminal only: an engine or a script calling us gets quiet stderr."""

    def __init__(self, what: str) -> None:
        self.what, self.shown, self.started = what, 0.0, time.monotonic()
        self.enabled = sys.stderr.isatty()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if self.enabled and now - self.shown >= 0.5:
            self.shown = now
            rate = done / max(now - self.started, 1e-6) / 2**20
            print(f"\r{self.what}: {done / 2**20:8.0f} MiB, {rate:6.0f} MiB/s", end="", file=sys.stderr, flush=True)

    def end(self) -> None:
        if self.enabled and self.shown:
            print(file=sys.stderr)


def _podman() -> str:
    from gpuckpt.shim.resolve import find_program

    podman = find_program("podman")
    if podman is None:
        raise UsageError("podman is not installed (export and import work on podman containers)")
    return podman


def run_export(options: argparse.Namespace) -> int:
    import zstandard

    from gpuckpt.fifo import open_when_peer, private_fifo
    from gpuckpt.oci.podman_archive import copy_checked
    from gpuckpt.process import Background

    podman, output = _podman(), os.path.abspath(options.output)
    if options.threads < 0:
        raise UsageError(f"--threads {options.threads}: give 0 (one per CPU) or more")
    if not os.path.isdir(os.path.dirname(output)):
        raise UsageError(f"-o {options.output}: no such directory {os.path.dirname(output)}")
    flags = [flag for flag, wanted in (("--leave-running", options.leave_running),
                                       ("--tcp-established", options.tcp_established)) if wanted]
    started = time.monotonic()
    partial = f"{output}.partial"
    with private_fifo("gpuckpt-export-") as fifo:
        podman_run = Background([podman, "container", "checkpoint", "--export", fifo, "--compress", "none",
                                 *flags, options.container])
        try:
            fd = open_when_peer(fifo, writing=False, peer_alive=podman_run.running)
            if fd is not None:
                progress = Progress(f"exporting {options.container}")
                compressor = zstandard.ZstdCompressor(level=1, threads=options.threads or os.cpu_count() or 1,
                                                      write_checksum=True)
                out_fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "rb") as stream, os.fdopen(out_fd, "wb") as raw, \
                        compressor.stream_writer(raw, closefd=False) as compressed:
                    moved = copy_checked(stream, compressed, f"podman's export of {options.container}", progress)
                progress.end()
            podman_run.wait(check=True)
            if fd is None:
                raise UsageError(f"podman finished without writing the archive of {options.container}")
        except BaseException:
            podman_run.kill()
            if os.path.exists(partial):
                os.unlink(partial)
            raise
    os.replace(partial, output)
    size = os.path.getsize(output)
    print(f"exported {options.container} to {output}: {moved / 2**20:.0f} MiB of checkpoint in "
          f"{size / 2**20:.0f} MiB, {time.monotonic() - started:.1f} s")
    return 0


def run_import(options: argparse.Namespace) -> int:
    from gpuckpt.fifo import open_when_peer, private_fifo, wait_reader_gone
    from gpuckpt.oci.archive import decompressed
    from gpuckpt.oci.podman_archive import check_podman_archive, copy_checked, write_config_only
    from gpuckpt.process import Background

    podman = _podman()
    started = time.monotonic()
    checked = check_podman_archive(options.archive)  # before podman sees a byte of it
    flags = ["--name", options.name] if options.name else []
    flags += ["--tcp-established"] if options.tcp_established else []
    with private_fifo("gpuckpt-import-") as fifo:
        podman_run = Background([podman, "container", "restore", "--import", fifo, *flags])
        try:
            passes = 0
            while (fd := open_when_peer(fifo, writing=True, peer_alive=podman_run.running)) is not None:
                passes += 1
                with os.fdopen(fd, "wb") as stream:
                    try:
                        if passes == 1:
                            write_config_only(checked, stream)
                        else:
                            progress = Progress(f"importing {options.archive}")
                            with open(options.archive, "rb") as raw:
                                copy_checked(decompressed(raw), stream, options.archive, progress)
                            progress.end()
                        stream.flush()
                        wait_reader_gone(fd, podman_run.running)
                    except BrokenPipeError:
                        pass  # podman stopped reading: it needed no more, or its message follows
            finished = podman_run.wait(check=True)
        except BaseException:
            podman_run.kill()
            raise
    restored = finished.stdout.strip().splitlines()[-1:] or [checked.config.name]
    print(f"restored {checked.config.name} as {restored[0][:12]} from {options.archive} in "
          f"{time.monotonic() - started:.1f} s")
    return 0
