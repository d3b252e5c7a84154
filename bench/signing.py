"""What signing costs: `gpuckpt export`'s pass unsigned and signed, `gpuckpt import`'s pass unchecked
and verified, on a generated podman-shaped tar holding --mib of pages (half random, a quarter zero,
a quarter a pattern). The passes only: no podman, no staging; the archive on --work (a disk).

    python3 bench/signing.py [--mib 3000] [--work /var/tmp]

Needs no root. Prints one line per pass (wall and CPU seconds, all threads), twice.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tarfile
import tempfile
import time

from gpuckpt.oci.archive import decompressed, open_archive
from gpuckpt.oci.podman_archive import ArchiveWriter, copy_checked
from gpuckpt.trust.keys import ensure_node_key, load_trust
from gpuckpt.trust.provenance import ExportSigning, verify_archive_signature

CHUNK = 64 << 20


class Pages(io.RawIOBase):
    """`size` bytes of memory pages: 64 MiB random, random, zero, a pattern, and again."""

    def __init__(self, size: int) -> None:
        self.size, self.at = size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.size - self.at, CHUNK - self.at % CHUNK)
        kind = self.at // CHUNK % 4
        buffer[:count] = os.urandom(count) if kind < 2 else bytes(count) if kind == 2 else \
            (b"pattern-" * (count // 8 + 1))[:count]
        self.at += count
        return count


def podman_tar(path: str, pages_bytes: int) -> None:
    with open(path, "wb") as out, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("config.dump", json.dumps({"id": "0" * 64, "name": "bench"}).encode()),
                           ("spec.dump", b"{}"), ("checkpoint/inventory.img", b"inventory")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("checkpoint/pages-1.img")
        info.size = pages_bytes
        tar.addfile(info, io.BufferedReader(Pages(pages_bytes), 8 << 20))


def export(plain: str, archive: str, signing: ExportSigning | None) -> None:
    writer = ArchiveWriter(archive)
    with open(plain, "rb") as source:
        copy_checked(source, writer.layer(), plain, observe=signing.observe if signing else None)
    writer.finish(None)
    if signing is not None:
        signing.finish(writer)


def import_pass(archive: str, verified: bool) -> None:
    with open_archive(archive) as raw:
        if not verified:
            copy_checked(decompressed(raw), None, archive)
            return
        verification = verify_archive_signature(archive, load_trust())
        copy_checked(decompressed(verification.reader(raw)), None, archive, observe=verification.observe)
        verification.finish()


def timed(what: str, step, *args) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    step(*args)
    print(f"{what:26} wall {time.perf_counter() - wall:6.2f} s  cpu {time.process_time() - cpu:6.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=3000, help="pages in the checkpoint (default 3000)")
    parser.add_argument("--work", default="/var/tmp", help="where the tar and the archive go (default /var/tmp)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=options.work, prefix="gpuckpt-bench-signing-") as work:
        os.environ["GPUCKPT_TRUST_DIR"] = os.path.join(work, "etc")  # a node key of the bench's own
        os.environ["GPUCKPT_TRUST_LOG"] = os.path.join(work, "trust.log")
        signer, _ = ensure_node_key()
        plain, archive = os.path.join(work, "plain.tar"), os.path.join(work, "bench.tar.zst")
        podman_tar(plain, options.mib << 20)
        print(f"{options.mib} MiB of pages, {len(os.sched_getaffinity(0))} CPUs")
        for _ in range(2):
            timed("export, unsigned", export, plain, archive, None)
            timed("export, signed", export, plain, archive, ExportSigning(signer))
            timed("import pass, unchecked", import_pass, archive, False)
            timed("import pass, verified", import_pass, archive, True)


if __name__ == "__main__":
    main()
