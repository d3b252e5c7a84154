"""An owned verb handed to gpuckpt-runtimed, the resident helper (shim/resident.py), when it listens.

Importing pydantic, cryptography and the verbs' models costs a fresh interpreter ~300 ms per call;
the helper has them loaded and forks a worker per verb. This side stays the process the engine
started: it sends its argv, environment, umask, working directory and stdio, starts the programs
the worker asks for (host/caller.py: they must be this process's children), passes on the signals
it gets, and exits with the worker's status. Loaded on every owned verb before anything heavy, so
it imports only built-in modules (`socket` alone costs ~9 ms; `_socket` nothing).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # built-in; `signal` (enum) costs ~6 ms
import _socket
import marshal
import os
import sys

import gpuckpt
from gpuckpt.node.paths import state_dir

SOCKET_NAME = "runtime.sock"
PROTOCOL = 1
MAX_MESSAGE = 1 << 20
FD_BYTES = 4
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH")
# Set to 0 by a caller that wants the verb worked in its own process (tests of that path, a debugger).
RESIDENT_ENV = "GPUCKPT_RESIDENT"


def socket_path() -> str:
    return os.path.join(state_dir(), SOCKET_NAME)


def package_identity() -> str:
    """Which installed gpuckpt this is: a helper running another one's code must not work our verbs."""
    here = os.path.dirname(gpuckpt.__file__)
    status = os.stat(os.path.join(here, "shim", "main.py"))
    return f"{os.path.realpath(here)}:{status.st_ino}:{status.st_mtime_ns}"


def _fds_data(fds: list[int]) -> list[tuple[int, int, bytes]]:
    data = b"".join(fd.to_bytes(FD_BYTES, sys.byteorder, signed=True) for fd in fds)
    return [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, data)] if fds else []


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(data[at:at + FD_BYTES], sys.byteorder, signed=True)
                    for at in range(0, len(data) - len(data) % FD_BYTES, FD_BYTES)]
    return fds


class _Gone(Exception):
    """The worker ended without its answer."""


class _Connection:
    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock

    def send(self, message: tuple, fds: list[int] | None = None) -> None:
        self.sock.sendmsg([marshal.dumps(message)], _fds_data(fds or []))

    def receive(self) -> tuple[tuple, list[int]]:
        try:
            data, ancillary, _flags, _ = self.sock.recvmsg(MAX_MESSAGE, _socket.CMSG_SPACE(FD_BYTES * 4),
                                                           _socket.MSG_CMSG_CLOEXEC)
        except OSError:
            raise _Gone() from None
        fds = _received_fds(ancillary)
        if not data:
            for fd in fds:
                os.close(fd)
            raise _Gone()
        try:
            message = marshal.loads(data)
        except (ValueError, EOFError, TypeError):
            message = ()
        if not isinstance(message, tuple) or not message:
            for fd in fds:
                os.close(fd)
            raise _Gone()
        return message, fds


def _connect() -> _Connection | None:
    """The helper's connection, or None (not listening, or not root's)."""
    if os.environ.get(RESIDENT_ENV) == "0":
        return None
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    except OSError:
        return None
    try:
        sock.connect(socket_path())
        peer = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
        if int.from_bytes(peer[4:8], sys.byteorder) != 0:
            raise OSError("not root's")
    except OSError:
        sock.close()
        return None
    return _Connection(sock)


def _spawn(request: tuple, fds: list[int]) -> tuple[tuple, list[int]]:
    """Start the program a worker asked for; ("spawned", pid) and its pidfd, or ("failed", errno, text)."""
    _, argv, env, targets = request
    try:
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(fds, targets, strict=True)]
        pid = os.posix_spawnp(argv[0], argv, env, file_actions=actions)
    except (OSError, ValueError, TypeError) as error:
        number = getattr(error, "errno", None) or 22
        return ("failed", number, getattr(error, "strerror", None) or str(error)), []
    finally:
        for fd in fds:
            os.close(fd)
    return ("spawned", pid), [os.pidfd_open(pid)]


def _serve(connection: _Connection) -> int:
    """Start and reap what the worker asks for until it says its exit status."""
    while True:
        message, fds = connection.receive()
        if message[0] == "exit":
            return int(message[1])
        if message[0] == "spawn" and len(message) == 4:
            answer, answer_fds = _spawn(message, fds)
        elif message[0] == "wait" and len(message) == 2:
            for fd in fds:
                os.close(fd)
            try:
                answer, answer_fds = ("waited", os.waitstatus_to_exitcode(os.waitpid(message[1], 0)[1])), []
            except ChildProcessError:
                answer, answer_fds = ("waited", 255), []
        else:
            for fd in fds:
                os.close(fd)
            raise _Gone()
        try:
            connection.send(answer, answer_fds)
        finally:
            for fd in answer_fds:
                os.close(fd)


def call_resident(argv: list[str], delegate: str, hook: str) -> int | None:
    """The verb's exit status as the helper's worker worked it; None when no helper takes it (the
    caller works it itself: nothing was done)."""
    connection = _connect()
    if connection is None:
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        connection.send(("call", PROTOCOL, package_identity(), sys.argv[0], argv, dict(os.environ), umask,
                         delegate, hook), [0, 1, 2, cwd])
        message, fds = connection.receive()
    except (OSError, _Gone):
        return None  # stdio closed, a message too big, the helper stopping: ours to work
    finally:
        os.close(cwd)
    for fd in fds:
        os.close(fd)
    if message[0] != "worker" or len(message) != 2:
        return None  # ("local", why): the helper cannot work this call in our place
    worker = int(message[1])

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(worker, signum)
        except OSError:
            pass

    for name in FORWARDED:
        _signal.signal(getattr(_signal, name), forward)
    try:
        return _serve(connection)
    except _Gone:
        from gpuckpt.shim.argv import parse_runtime_args  # deferred: only for this error
        from gpuckpt.shim.log import report_error

        report_error(parse_runtime_args(argv), "gpuckpt-runtime: the resident helper (gpuckpt-runtimed) ended "
                                               "before the verb did; see its journal")
        return 1
