"""node/put_back.py's drain: podman holds the export's FIFO read-write, so only reading it to the end
lets podman finish; the drain must end when the writer does, whether it opened the FIFO yet or not."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gpuckpt.host.fifo import private_fifo
from gpuckpt.host.process import Background
from gpuckpt.node.put_back import drain_until_ended, put_back

# as podman's os.Create opens it: read-write, so no reader's leaving fails its writes
WRITER = "import os, sys, time; time.sleep(float(sys.argv[2])); fd = os.open(sys.argv[1], os.O_RDWR)\n" \
         "for _ in range(32): os.write(fd, b'x' * (1 << 20))"


def test_the_drain_reads_a_read_write_writer_to_its_end() -> None:
    with private_fifo("gpuckpt-test-") as fifo:
        writer = Background([sys.executable, "-c", WRITER, fifo, "0.5"])  # 0.5 s: a dump before the stream
        started = time.monotonic()
        drain_until_ended(fifo, writer, "c")
        assert not writer.running()
        assert writer.wait().returncode == 0  # 32 MiB written through a 64 KiB pipe: all of it was read
        assert time.monotonic() - started < 30


def test_the_drain_ends_with_a_writer_that_never_opens() -> None:
    with private_fifo("gpuckpt-test-") as fifo:
        writer = Background([sys.executable, "-c", "import time; time.sleep(0.3)"])
        drain_until_ended(fifo, writer, "c")
        assert not writer.running()


# podman's stand-in for put_back: `container inspect` answers "false USERDATA", `container exists` 0, and
# `container restore` fails as podman 4.3 does without a complete checkpoint; every call logged
FAKE_PODMAN = """import os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.log"), "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["container", "inspect"]:
    print("false", os.path.join(here, "userdata"))
elif sys.argv[1:3] == ["container", "restore"]:
    print("Error: a complete checkpoint for this container cannot be found, cannot restore", file=sys.stderr)
    sys.exit(125)
"""


def _fake_podman(tmp_path: Path) -> Path:
    (tmp_path / "fake_podman.py").write_text(FAKE_PODMAN)
    podman = tmp_path / "podman"
    podman.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'fake_podman.py'} \"$@\"\n")
    podman.chmod(0o755)
    (tmp_path / "userdata").mkdir()
    return podman


def test_a_container_podman_never_checkpointed_is_not_said_to_be_restorable(tmp_path: Path) -> None:
    """The trial of 2026-11-28 exported a container that never started ("created"): the line said `podman
    container restore NAME` brings it back, and that restore failed (no checkpoint). No checkpoint: the
    restore is not tried, and the line says how to start it."""
    podman = _fake_podman(tmp_path)
    with private_fifo("gpuckpt-test-") as fifo:
        said = put_back(str(podman), "web", Background([sys.executable, "-c", "pass"]), fifo, tcp_established=False)
    assert said == "web is not running and podman kept no checkpoint of it: `podman start web` starts it"
    assert "container restore" not in (tmp_path / "calls.log").read_text()


def test_a_kept_checkpoint_whose_restore_failed_is_named_with_the_command(tmp_path: Path) -> None:
    podman = _fake_podman(tmp_path)
    (tmp_path / "userdata" / "checkpoint").mkdir()
    (tmp_path / "userdata" / "checkpoint" / "inventory.img").write_bytes(b"")
    with private_fifo("gpuckpt-test-") as fifo:
        said = put_back(str(podman), "web", Background([sys.executable, "-c", "pass"]), fifo, tcp_established=False)
    assert said == (f"web is stopped: `podman container restore web` brings it back (its checkpoint is kept in "
                    f"{tmp_path / 'userdata' / 'checkpoint'})")
    assert "container restore web" in (tmp_path / "calls.log").read_text()
