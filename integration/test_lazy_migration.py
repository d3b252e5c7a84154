"""Lazy migration at runc level, plain runc and through gpuckpt-runtime side by side (#31 item 1).

One container each way: `checkpoint --lazy-pages --page-server --status-fd`, CRIU's lazy-pages
daemon, `restore --lazy-pages` under another name, as runc's own checkpoint.bats does it. The
shim's part is checked where it acts (the \\0 on the engine's descriptor, the manifest "lazy,
completing" and signed at that moment, the lazy restore let through to the delegate); the end
(restored and running, or failed in CRIU where this kernel does not allow lazy pages) must be the
same as runc's, and through the shim never a refusal of its own.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from bed import RUNTIME, RUNTIME_ROOT, free_port, make_bundle, sh

from gpuckpt.oci.manifest import DUMP_LAZY_COMPLETING, dump_state, read_manifest
from gpuckpt.trust.dump_signature import DUMP_SIGNATURE

RUNC = shutil.which("runc") or "/usr/sbin/runc"
SHIM_WORDS = ("never completed", "refused", "is lazy, completing", "gpuckpt")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runc and CRIU need root")


@dataclass
class LazyOutcome:
    status_byte: bytes  # what the engine read from its --status-fd
    manifest_state: str  # the image's manifest when the engine heard ("" without one: plain runc)
    signed_then: bool
    restore_status: int
    restore_words: str
    checkpoint_status: int
    criu_restore_error: str  # CRIU's error lines of the restore, if it failed


def criu_errors(log: Path) -> str:
    """CRIU's error lines in `log`, joined ("" when it has none or does not exist)."""
    if not log.exists():
        return ""
    return " | ".join(line for line in log.read_text(errors="replace").splitlines() if "Error (" in line)


def lazy_migration(runtime: str, rootfs: Path, work: Path, name: str) -> LazyOutcome:
    """runc's checkpoint.bats lazy test, by `runtime`, on a container of the test bed's rootfs."""
    work.mkdir()
    bundle = make_bundle(rootfs, work)
    # the restore works in the image directory, as runc's test has it: CRIU's restore finds the lazy-pages
    # daemon's socket in its work directory, and the daemon makes it in the directory it serves
    images, dump_work = work / "images", work / "dump-work"
    for directory in (images, dump_work):
        directory.mkdir(mode=0o700)
    base = [runtime, "--root", RUNTIME_ROOT]
    with open(os.devnull, "r+b") as null:
        started = subprocess.run([*base, "run", "-d", name], stdin=null, stdout=null, stderr=null, cwd=bundle,
                                 timeout=120)
    assert started.returncode == 0, f"{runtime} run -d {name} exited {started.returncode}"
    time.sleep(1)  # the counter running: pages to serve
    port = free_port()
    status_read, status_write = os.pipe()
    checkpoint = subprocess.Popen(
        [*base, "checkpoint", "--lazy-pages", "--page-server", f"127.0.0.1:{port}", "--status-fd", str(status_write),
         "--work-path", str(dump_work), "--image-path", str(images), name],
        pass_fds=(status_write,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, cwd=bundle, start_new_session=True)  # its group: the runc and criu under it go with it
    os.close(status_write)
    daemon = None
    try:
        ready, _, _ = select.select([status_read], [], [], 60)
        status_byte = os.read(status_read, 1) if ready else b"(nothing in 60 s)"
        manifest = read_manifest(str(images))
        manifest_state = dump_state(manifest) if manifest is not None else ""
        signed_then = (images / DUMP_SIGNATURE).exists()
        daemon = subprocess.Popen(["criu", "lazy-pages", "--page-server", "--address", "127.0.0.1", "--port",
                                   str(port), "-D", str(images), "-o", str(work / "lazy-pages.log")],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        with open(os.devnull, "r+b") as null:
            restored = subprocess.run(
                [*base, "restore", "-d", "--lazy-pages", "--work-path", str(images), "--image-path", str(images),
                 "--bundle", str(bundle), f"{name}-migrated"],
                stdin=null, stdout=null, stderr=subprocess.PIPE, text=True, cwd=bundle, timeout=120)
        try:  # a dump whose pages nobody takes waits: runc's ends once the restore side failed
            checkpoint_status = checkpoint.wait(timeout=60)
        except subprocess.TimeoutExpired:
            checkpoint_status = -1
        return LazyOutcome(status_byte, manifest_state, signed_then, restored.returncode, restored.stderr,
                           checkpoint_status, criu_errors(images / "restore.log"))
    finally:
        os.close(status_read)
        for child in (checkpoint, daemon):  # a dump still waiting for its pages: with its runc and criu
            if child is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        for container in (name, f"{name}-migrated"):
            sh(RUNC, "--root", RUNTIME_ROOT, "delete", "-f", container, check=False)


def test_lazy_migration_through_the_shim_ends_as_with_runc(rootfs, tmp_path) -> None:
    if subprocess.run(["criu", "check", "--feature", "uffd-noncoop"], capture_output=True).returncode != 0:
        pytest.skip("this CRIU or kernel has no uffd-noncoop: runc's own lazy test skips too")
    name = f"gpuckpt-lazy-{os.getpid()}"
    with_runc = lazy_migration(RUNC, rootfs, tmp_path / "runc", f"{name}-runc")
    through_shim = lazy_migration(RUNTIME, rootfs, tmp_path / "shim", f"{name}-shim")
    print(f"\nrunc: {with_runc}\nshim: {through_shim}")

    # the handshake: the engine hears \0 once the page server is ready, by then the image says so
    assert with_runc.status_byte == through_shim.status_byte == b"\0"
    assert through_shim.manifest_state == DUMP_LAZY_COMPLETING and through_shim.signed_then
    # the same end: the restore's and the checkpoint's exit statuses as runc's
    assert through_shim.restore_status == with_runc.restore_status
    assert through_shim.checkpoint_status == with_runc.checkpoint_status  # -1: still waiting after 60 s
    if with_runc.restore_status != 0:  # this kernel: CRIU's failure, passed on, nothing of ours
        assert with_runc.criu_restore_error and through_shim.criu_restore_error
        # the shim adds one line, CRIU's own first error from restore.log (shim/restore.py say_criu_cause)
        cause = [line for line in through_shim.restore_words.splitlines() if "-migrated failed; CRIU: " in line]
        assert len(cause) == 1, through_shim.restore_words
        assert cause[0].split("failed; CRIU: ", 1)[1].split(" (", 1)[0] in through_shim.criu_restore_error, cause
        others = "\n".join(line for line in through_shim.restore_words.splitlines() if line not in cause)
        assert not any(word in others for word in SHIM_WORDS), others
