"""A lazy checkpoint (`--lazy-pages`): runc's `--status-fd` handshake, passed through the shim.

With --lazy-pages the dump writes everything but the memory pages, then CRIU serves the pages
from its page server until a lazy restore has taken them all; the delegate's checkpoint ends only
then. runc writes one \\0 to --status-fd when that server is ready (CRIU's "status-ready"), and
the engine starts the restore on it while the dump still runs. The shim hands the delegate a pipe
of its own as --status-fd (always, so it knows the moment even when the engine gave none): on the
\\0 it marks the manifest "lazy, completing" and signs the images written so far, and only then
passes the \\0 on to the engine's descriptor, so the restore it starts finds an image it accepts.

A GPU container's lazy checkpoint is refused before anything is touched: its device state is
written as a whole by the driver's checkpoint, and cannot be paged in lazily.
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Callable, Sequence

from ..errors import CheckpointRefusedError
from .argv import VerbArgs
from .delegate import DelegateRun
from .staging import replace_flag

LAZY_FLAG = "lazy-pages"
STATUS_FD_FLAGS = ("--status-fd",)
POLL_MS = 200  # how often the wait for CRIU's \0 looks whether the delegate ended without sending it


def is_lazy(verb: VerbArgs) -> bool:
    return verb.has(LAZY_FLAG)


def refuse_lazy_gpu(container_id: str) -> None:
    """A GPU container's lazy checkpoint: one line, before anything is touched."""
    raise CheckpointRefusedError(
        f"checkpoint of {container_id} refused: --lazy-pages is not supported for a container with GPUs (its "
        "device state is saved by the CUDA driver as a whole and cannot be paged in lazily by CRIU's page "
        "server); checkpoint it without --lazy-pages")


def engine_status_fd(verb: VerbArgs) -> int | None:
    """The engine's --status-fd, as runc takes it (-1 or none: no descriptor)."""
    value = verb.value("status-fd")
    if value is None:
        return None
    try:
        fd = int(value, 10)
    except ValueError:
        return None  # the delegate refuses it in its own words
    return fd if fd >= 0 else None


class LazyHandshake:
    """The delegate's --status-fd replaced by a pipe of ours; `wait_ready` reads CRIU's \\0 from it,
    `forward` writes it to the engine's descriptor once the image is ready to be restored."""

    def __init__(self, verb: VerbArgs) -> None:
        self.engine_fd = engine_status_fd(verb)
        self._read_fd, self._write_fd = os.pipe()  # O_CLOEXEC both: only the write end is given on
        os.set_inheritable(self._write_fd, True)
        self.ready = False

    def argv(self, argv: Sequence[str], verb_index: int) -> list[str]:
        """The delegate's argv with our pipe as its --status-fd (added where the engine gave none)."""
        given = list(argv)
        at = verb_index + 1
        if replace_flag(given, at, STATUS_FD_FLAGS, str(self._write_fd)):
            return given
        return [*given[:at], "--status-fd", str(self._write_fd), *given[at:]]

    def started(self) -> None:
        """The delegate holds the write end now: ours closed, so a delegate that ends without the \\0 ends the wait."""
        with contextlib.suppress(OSError):
            os.close(self._write_fd)

    def wait_ready(self, dump: DelegateRun) -> bool:
        """Wait for the \\0 (the page server ready) or the delegate's end; whether the \\0 came."""
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN | select.POLLHUP)
        while True:
            if poller.poll(POLL_MS):
                self.ready = os.read(self._read_fd, 1) == b"\0"
                return self.ready
            if dump.poll() is not None:  # ended without it (a helper may still hold the pipe open)
                return False

    def forward(self) -> None:
        """The \\0 passed on to the engine's descriptor and that descriptor closed, as runc does."""
        if self.engine_fd is None:
            return
        with contextlib.suppress(OSError):  # a reader gone: runc only warns as well
            os.write(self.engine_fd, b"\0")
        with contextlib.suppress(OSError):
            os.close(self.engine_fd)
        self.engine_fd = None

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def lazy_dump(dump: DelegateRun, handshake: LazyHandshake, on_ready: Callable[[], None],
              finish: Callable[[DelegateRun], int]) -> int:
    """The started lazy `dump` to its end (`finish`: bounded by criu.peer_timeout_s): `on_ready` (the manifest
    marked lazy, the images signed) run when the page server is ready, before the engine hears of it; the
    delegate's exit status."""
    try:
        handshake.started()
        if handshake.wait_ready(dump):
            on_ready()
            handshake.forward()
        return finish(dump)
    finally:
        handshake.close()
