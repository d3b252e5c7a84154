"""Programs a verb starts while the resident helper works it: started by the caller, not by us.

gpuckpt-runtimed (shim/resident/server.py) works an owned verb in a process forked from itself, but
the programs the verb runs (the delegate runtime above all) must be children of the
gpuckpt-runtime process the engine started: a restored container's init is reparented to that
process's subreaper (conmon) when the delegate exits, and the delegate must run in that process's
cgroup, with its fds and limits. So the worker asks the caller (shim/resident/call.py) to start
each one, over the connection the verb came on, and gets a pidfd back: waiting for the exit
status is the caller's (only a parent can reap), signals and exit are seen through the pidfd.

Messages are marshal'd tuples on a SOCK_SEQPACKET socket, both ends root and the same interpreter:
("spawn", argv, env, targets, close_fds) with one fd per target fd number (the child's stdin/stdout/
stderr where the verb wants them elsewhere than the caller's; with close_fds, the caller's other fds
stay out, as subprocess.run keeps ours out of a program it runs), answered ("spawned", pid) with the pidfd,
or ("failed", errno, text); ("wait", pid) answered ("waited", returncode as subprocess gives it).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, BinaryIO

from ...host import process
from ...host.programs import CommandError
from . import messages

if TYPE_CHECKING:
    from .messages import Message


class CallerGone(CommandError):
    """The gpuckpt-runtime process that brought the verb has ended (killed by its engine)."""

    def __init__(self) -> None:
        super().__init__("gpuckpt-runtime's calling process has ended")


class Caller:
    """The connection to the gpuckpt-runtime process whose verb this worker runs."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.pid = messages.peer_credentials(connection)[0]  # checked a root process of ours before the fork

    def ask(self, message: Message, fds: Sequence[int] = ()) -> tuple[Message, list[int]]:
        try:
            messages.send(self.connection, message, fds)
            return messages.receive(self.connection)
        except (OSError, messages.PeerGone):
            raise CallerGone() from None

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: int | None = None,
              stdout: int | None = None, stderr: int | None = None, close_fds: bool = False) -> CallerChild:
        """Start `argv` as the caller's child: its stdio the caller's, except where an fd is given; every
        other fd of the caller's too, unless `close_fds`."""
        targets = [(fd, target) for target, fd in ((0, stdin), (1, stdout), (2, stderr)) if fd is not None]
        answer, fds = self.ask(("spawn", list(argv), dict(os.environ if env is None else env),
                                [target for _, target in targets], close_fds), [fd for fd, _ in targets])
        if answer[0] != "spawned" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            if answer[0] == "failed":
                raise OSError(answer[1], answer[2])
            raise CallerGone()
        return CallerChild(self, answer[1], fds[0])

    def reap(self, pid: int) -> int:
        answer, fds = self.ask(("wait", pid))
        for fd in fds:
            os.close(fd)
        if answer[0] != "waited":
            raise CallerGone()
        return int(answer[1])


class CallerChild:
    """A program the caller started for us: what the verbs use of subprocess.Popen."""

    def __init__(self, caller: Caller, pid: int, pidfd: int) -> None:
        self.caller, self.pid, self.pidfd = caller, pid, pidfd
        self.returncode: int | None = None
        self.stdin: BinaryIO | None = None
        self.stdout: BinaryIO | None = None
        self.stderr: BinaryIO | None = None

    def _ended(self, timeout_s: float | None) -> bool:
        return bool(select.select([self.pidfd], [], [], timeout_s)[0])

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0):
            self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (-N for signal N); with `timeout`, TimeoutError if it runs past it."""
        if self.returncode is None:
            # Its end seen through the pidfd first: should the caller die meanwhile, we still wait for the
            # program (a dump in progress) before anything else, a rollback above all
            if not self._ended(timeout):
                raise TimeoutError(self.pid)
            self.returncode = self.caller.reap(self.pid)
            os.close(self.pidfd)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # the program has ended already
                signal.pidfd_send_signal(self.pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input_bytes: bytes | None, timeout_s: float) -> tuple[bytes, bytes] | None:
        """Write `input_bytes` to stdin, read stdout and stderr to their ends and wait, all within
        `timeout_s`; None when it ran past it (the program killed and reaped)."""
        deadline = time.monotonic() + timeout_s
        pending = input_bytes or b""
        streams = [stream for stream in (self.stdout, self.stderr) if stream is not None]
        read_fds = [stream.fileno() if stream is not None else -1 for stream in (self.stdout, self.stderr)]
        outputs: dict[int, list[bytes]] = {fd: [] for fd in read_fds}
        readers = [fd for fd in read_fds if fd >= 0]
        if self.stdin is not None and not pending:
            self.stdin.close()
        try:
            self._exchange(readers, pending, outputs, deadline)
            self.wait(max(deadline - time.monotonic(), 0))
        except TimeoutError:
            self.kill()
            self.wait()
            return None
        finally:
            for stream in (self.stdin, *streams):
                if stream is not None and not stream.closed:
                    stream.close()
        return b"".join(outputs[read_fds[0]]), b"".join(outputs[read_fds[1]])

    def _exchange(self, readers: list[int], pending: bytes, outputs: dict[int, list[bytes]], deadline: float) -> None:
        """communicate()'s loop: `pending` written to stdin, `readers` read into `outputs` (by fd), until each
        is done; TimeoutError past `deadline`."""
        writers = [self.stdin.fileno()] if self.stdin is not None and pending else []
        while readers or writers:
            readable, writable, _ = select.select(readers, writers, [], max(deadline - time.monotonic(), 0))
            if not readable and not writable:
                raise TimeoutError(self.pid)
            for fd in readable:
                chunk = os.read(fd, 65536)
                if chunk:
                    outputs[fd].append(chunk)
                else:
                    readers.remove(fd)
            for fd in writable:
                try:
                    pending = pending[os.write(fd, pending[:65536]):]
                except BrokenPipeError:
                    pending = b""
                if not pending and self.stdin is not None:
                    self.stdin.close()
                    writers = []


def work_for(caller: Caller) -> None:
    """From now on this process's programs are started by `caller` (a resident worker, once)."""
    process.start_programs_through(caller)
