"""node/put_back.py's drain: podman holds the export's FIFO read-write, so only reading it to the end
lets podman finish; the drain must end when the writer does, whether it opened the FIFO yet or not."""

from __future__ import annotations

import sys
import time

from gpuckpt.host.fifo import private_fifo
from gpuckpt.host.process import Background
from gpuckpt.node.put_back import drain_until_ended

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
