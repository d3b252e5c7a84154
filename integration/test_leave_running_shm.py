"""A job whose processes hand work over /dev/shm, exported with --leave-running and imported, finishes as it would have.

podman 4.3 copies the container's /dev/shm into the archive (devshm-checkpoint.tar) only after the runtime's dump
returned, while the original runs on (libpod checkpoint(): CheckpointContainer, then the /dev/shm tar): that copy is
of a later moment than the processes' memory. multiprocessing's queues (a DataLoader's workers) keep their
semaphores' counts in /dev/shm; the job here keeps its hand-over's sequence numbers there the same way (the test
image's python3-minimal has no multiprocessing and no mmap), so an import of podman's copy waits for ever (the 2x
H200 DDP import, results/gpu/ddp-import-h200x2-2026-11-28). The shim copies /dev/shm while the dump holds the
container frozen, into the image, and a restore of the import puts that copy in place of podman's, through
`gpuckpt import` and through podman's own `restore --import` (transfer/devshm.py, transfer/root_files.py).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time

import pytest
import zstandard
from bed import GPUCKPT, PODMAN_IMAGE, sh

ITEMS = 100_000
# A parent and 2 forked workers: the hand-over's state (a sequence number per worker, posted and done) in
# /dev/shm/job-board, items and results in /dev/shm files, wake-ups over pipes (a semaphore's futex wait). A
# worker woken for a number it does not wait for, or a parent that finds the board behind, waits for the next
# wake-up. At the end: "/tmp/digest" holds the digest of every result in order.
JOB = """
import hashlib, os, struct, sys, time
N, WORKERS = int(sys.argv[1]), 2
def shm(name):
    return os.open("/dev/shm/" + name, os.O_RDWR | os.O_CREAT, 0o600)
board, items, results = shm("job-board"), shm("job-items"), shm("job-results")
os.pwrite(board, bytes(16 * WORKERS), 0)
def get(offset):
    return struct.unpack("<q", os.pread(board, 8, offset))[0]
def put(offset, value):
    os.pwrite(board, struct.pack("<q", value), offset)
def payload(i):
    return hashlib.sha256(b"item %d" % i).digest()
def work(data):
    return hashlib.sha256(data * 64).digest()
wakes = [os.pipe() for _ in range(WORKERS)]
done_r, done_w = os.pipe()
for w in range(WORKERS):
    if os.fork() == 0:
        seen = 0
        while True:
            os.read(wakes[w][0], 1)
            if get(16 * w) != seen + 1:
                continue
            seen += 1
            os.pwrite(results, work(os.pread(items, 32, 32 * w)), 32 * w)
            put(16 * w + 8, seen)
            os.write(done_w, b"d")
digest, seq, i = hashlib.sha256(), [0] * WORKERS, 0
while i < N:
    batch = range(min(WORKERS, N - i))
    for w in batch:
        seq[w] += 1
        os.pwrite(items, payload(i + w), 32 * w)
        put(16 * w, seq[w])
        os.write(wakes[w][1], b"w")
    for w in batch:
        os.read(done_r, 1)
    while any(get(16 * w + 8) != seq[w] for w in batch):
        os.read(done_r, 1)
    for w in batch:
        digest.update(os.pread(results, 32, 32 * w))
    i += len(batch)
    if i % 1000 == 0:
        with open("/tmp/progress", "w") as progress:
            progress.write(f"{i}\\n")
with open("/tmp/digest", "w") as out:
    out.write(digest.hexdigest() + "\\n")
while True:
    time.sleep(3600)
"""


def expected_digest(items: int) -> str:
    """What the job writes when nothing interrupts it: the same items and work, in order, here."""
    digest = hashlib.sha256()
    for i in range(items):
        digest.update(hashlib.sha256(hashlib.sha256(b"item %d" % i).digest() * 64).digest())
    return digest.hexdigest()


@pytest.fixture
def shm_job(tmp_path, monkeypatch):
    """The job in a container with a config of the test's own (GPUCKPT_CONFIG, which podman hands the runtime)."""
    config = tmp_path / "config.toml"
    config.write_text('delegate = "runc"\n')
    config.chmod(0o644)
    monkeypatch.setenv("GPUCKPT_CONFIG", str(config))
    name = f"gpuckpt-shmjob-{os.getpid()}"
    sh("podman", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none", PODMAN_IMAGE,
       "python3", "-c", JOB, str(ITEMS))
    yield name
    sh("podman", "rm", "-f", "-t", "0", name, check=False)


def _read(name: str, path: str) -> str:
    return sh("podman", "exec", name, "cat", path, check=False).stdout.strip()


def _wait_digest(name: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if digest := _read(name, "/tmp/digest"):
            return digest
        time.sleep(0.5)
    return f"no digest within {timeout_s:g} s (progress {_read(name, '/tmp/progress') or 'none'})"


def _podmans_import(archive: str) -> subprocess.CompletedProcess:
    """podman's own `restore --import` of the archive, decompressed first (podman 4.3 reads plain tars)."""
    plain = archive.removesuffix(".zst")
    with open(archive, "rb") as source, open(plain, "wb") as out:
        zstandard.ZstdDecompressor().copy_stream(source, out)
    return sh("podman", "container", "restore", "--import", plain, check=False)


@pytest.mark.parametrize("importer", ["gpuckpt", "podman"])
def test_leave_running_export_of_a_shm_hand_over_imports_and_finishes(shm_job, tmp_path, importer):
    name, archive = shm_job, str(tmp_path / "job.tar.zst")
    expected = expected_digest(ITEMS)
    deadline = time.monotonic() + 60
    while not (progress := _read(name, "/tmp/progress")) or int(progress) < 5000:
        assert time.monotonic() < deadline, "the job did not start handing work over"
        time.sleep(0.1)
    sh(GPUCKPT, "export", name, "-o", archive, "--leave-running")
    assert _wait_digest(name, 120) == expected  # the original, run on to its end
    sh("podman", "rm", "-f", "-t", "0", name)
    imported = sh(GPUCKPT, "import", archive, check=False) if importer == "gpuckpt" else _podmans_import(archive)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    # before the fix: the board in podman's copy is ahead of the processes, which wait for ever
    assert _wait_digest(name, 120) == expected
