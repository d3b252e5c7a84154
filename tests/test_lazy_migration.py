"""Lazy migration through the shim (#31 item 1): runc's --status-fd handshake, the manifest's
"lazy, completing" state, the restore that accepts it only when lazy, a GPU container refused.

The delegate is tests/fake_runtime.py: with --lazy-pages it writes \\0 to the --status-fd it got,
as runc does when CRIU's page server is ready, then waits until the test says the pages were taken.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest
import test_gpu_verbs

from gpuckpt.cuda.node import NodeGpus
from gpuckpt.errors import CheckpointRefusedError, ImageError
from gpuckpt.oci.manifest import DUMP_COMPLETED, DUMP_LAZY_COMPLETING, dump_state, parse_manifest, read_manifest
from gpuckpt.shim import restore
from gpuckpt.shim.argv import parse_runtime_args
from gpuckpt.trust.dump_signature import DUMP_SIGNATURE

make_node = test_gpu_verbs.make_node  # the fake node, its runtime and its driver (fixtures)

LAZY = ("--lazy-pages", "--page-server", "127.0.0.1:27277")


# The shim's checkpoint as the engine runs it: its own process (it sets signal handlers, which only a main
# thread may), so that this test's main thread can act as the engine meanwhile.
CHECKPOINT = """
import sys
from gpuckpt.shim import checkpoint
from gpuckpt.shim.argv import parse_runtime_args
runtime, images, *extra = sys.argv[1:]
sys.exit(checkpoint.run(parse_runtime_args(["--root", "/r", "checkpoint", "--image-path", images, *extra, "ctr"]),
                        runtime))
"""


class LazyCheckpoint:
    """The shim's lazy checkpoint of `node`, started, with the engine's status pipe."""

    def __init__(self, node, *, engine_status_fd: bool = True) -> None:
        self.node = node
        self.engine_read, self.engine_write = os.pipe()
        extra = [*LAZY, "--status-fd", str(self.engine_write)] if engine_status_fd else list(LAZY)
        self.shim = subprocess.Popen([sys.executable, "-c", CHECKPOINT, str(node.runtime), str(node.images), *extra],
                                     pass_fds=(self.engine_write,), stderr=subprocess.PIPE, text=True)
        os.close(self.engine_write)  # the shim holds it now: EOF here once it closed it

    def engine_hears(self, timeout_s: float = 10.0) -> bytes:
        """What the engine reads from its --status-fd (b"" at EOF), as runc's tests do with dd."""
        ready, _, _ = select.select([self.engine_read], [], [], timeout_s)
        assert ready, "the engine's --status-fd got nothing"
        return os.read(self.engine_read, 1)

    def pages_taken(self) -> int:
        """The lazy restore took every page: the delegate's dump ends; the shim's exit status."""
        (self.node.dir / "lazy.taken").write_text("")
        _, self.stderr = self.shim.communicate(timeout=30)
        os.close(self.engine_read)
        return self.shim.returncode


def restore_elsewhere(node, *lazy: str):
    """A restore under another name, as runc's test does: the checkpointed container is not gone yet (it goes
    when the last page was taken)."""
    return parse_runtime_args(["--root", "/r", "restore", "-d", *lazy, "--bundle", str(node.bundle),
                               "--image-path", str(node.images), "ctr-migrated"])


def test_a_lazy_checkpoint_is_lazy_completing_when_the_engine_hears_and_a_lazy_restore_takes_it(make_node) -> None:
    node = make_node(1, gpu=False)
    lazy = LazyCheckpoint(node)
    assert lazy.engine_hears() == b"\0"
    # the moment the engine hears: marked lazy, completing, and signed, while the dump still runs
    manifest = read_manifest(str(node.images))
    assert dump_state(manifest) == DUMP_LAZY_COMPLETING == "lazy, completing"
    assert (node.images / DUMP_SIGNATURE).exists()
    assert lazy.shim.poll() is None
    # the delegate got a pipe of the shim's as --status-fd, not the engine's descriptor
    given_fd, leads_to = (node.dir / "status_fd.log").read_text().split()
    assert leads_to.startswith("pipe:") and leads_to != os.readlink(f"/proc/self/fd/{lazy.engine_read}")

    before = len(node.calls())
    with pytest.raises(ImageError) as refused:  # a plain restore cannot take pages still at the source
        restore.run(restore_elsewhere(node), str(node.runtime), NodeGpus(**node.gpus))
    assert "\n" not in str(refused.value)
    assert "is lazy, completing" in str(refused.value) and "--lazy-pages" in str(refused.value)
    assert "restore" not in node.verbs_called()[before:]

    assert restore.run(restore_elsewhere(node, "--lazy-pages"), str(node.runtime), NodeGpus(**node.gpus)) == 0
    assert node.verbs_called()[-1] == "restore"
    seen = parse_manifest((node.dir / "lazy_restore_saw.json").read_bytes(), "seen")
    assert dump_state(seen) == DUMP_LAZY_COMPLETING

    assert lazy.pages_taken() == 0
    completed = read_manifest(str(node.images))
    assert dump_state(completed) == DUMP_COMPLETED and completed.lazy_pages


def test_without_the_engines_status_fd_the_shim_still_knows_when_the_page_server_is_ready(make_node) -> None:
    node = make_node(1, gpu=False)
    lazy = LazyCheckpoint(node, engine_status_fd=False)
    call = node_calls_when(node, "checkpoint")[0]
    assert "--status-fd" in call  # the shim's own pipe
    for _ in range(500):  # the shim marks it once the delegate's \0 came
        if (node.images / DUMP_SIGNATURE).exists():
            break
        time.sleep(0.02)
    assert dump_state(read_manifest(str(node.images))) == DUMP_LAZY_COMPLETING
    assert lazy.pages_taken() == 0


def node_calls_when(node, verb: str):
    """The delegate's calls of `verb`, waiting until one was made."""
    for _ in range(500):
        calls = [call for call in node.calls() if verb in call and "--image-path" in call]
        if calls:
            return calls
        time.sleep(0.02)
    raise AssertionError(f"no {verb} call")


def test_a_lazy_dump_that_fails_after_the_handshake_is_refused_as_never_completed(make_node) -> None:
    node = make_node(1, gpu=False)
    node.set_runtime(checkpoint_status=1)
    lazy = LazyCheckpoint(node)
    assert lazy.engine_hears() == b"\0"
    assert lazy.pages_taken() == 1
    manifest = read_manifest(str(node.images))
    assert not manifest.dump_completed and not manifest.lazy_pages
    assert not (node.images / DUMP_SIGNATURE).exists()  # signed at the handshake, withdrawn
    node.set_runtime()
    with pytest.raises(ImageError, match="the dump of ctr never completed"):
        restore.run(restore_elsewhere(node, "--lazy-pages"), str(node.runtime), NodeGpus(**node.gpus))


def test_a_dump_that_ends_without_the_handshake_tells_the_engine_nothing(make_node) -> None:
    node = make_node(1, gpu=False)
    node.set_runtime(checkpoint_status=1, lazy_ready=False)
    lazy = LazyCheckpoint(node)
    assert lazy.engine_hears() == b""  # EOF: the shim closed it without a \0
    assert lazy.pages_taken() == 1
    manifest = read_manifest(str(node.images))
    assert not manifest.dump_completed and not manifest.lazy_pages


def test_a_gpu_containers_lazy_checkpoint_is_refused_before_anything_is_touched(make_node) -> None:
    node = make_node(2)
    with pytest.raises(CheckpointRefusedError) as refused:
        node.checkpoint(*LAZY)
    message = str(refused.value)
    assert "\n" not in message and "--lazy-pages" in message and "GPU" in message
    assert "checkpoint" not in node.verbs_called()
    assert node.driver.calls_of("lock") == [] and node.all_running()
    assert not (node.images / "gpuckpt-manifest.json").exists()


def test_a_non_lazy_manifest_is_written_as_older_gpuckpt_reads_it(make_node) -> None:
    node = make_node(1, gpu=False)
    assert node.checkpoint() == 0
    written = json.loads((node.images / "gpuckpt-manifest.json").read_text())
    assert "lazy_pages" not in written and written["dump_completed"] is True
