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
import errno
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
NAMESPACES = ("mnt", "pid", "net", "user", "ipc", "uts", "cgroup")
# The helper's worker answers within its own hello timeout (10 s) or never; past this we work the verb. A worker
# whose answer comes after we closed sees its first request fail and does nothing more.
FIRST_ANSWER_TIMEOUT_S = 15.0
SO_PEERPIDFD = 77  # Linux 6.5: the peer process itself, where SO_PEERCRED's PID may since be another's
# What subprocess's restore_signals puts back for a child: Python ignores them, a program expects them.
DEFAULT_SIGNALS = (_signal.SIGPIPE, _signal.SIGXFSZ)


def socket_path() -> str:
    return os.path.join(state_dir(), SOCKET_NAME)


def package_identity() -> str:
    """Which installed gpuckpt this is: a helper running another one's code must not work our verbs."""
    here = os.path.dirname(gpuckpt.__file__)
    status = os.stat(os.path.join(here, "shim", "main.py"))
    return f"{os.path.realpath(here)}:{status.st_ino}:{status.st_mtime_ns}"


def _namespace_ids(pid: int | str) -> list[tuple[int, int]]:
    return [(status.st_dev, status.st_ino) for status in
            (os.stat(f"/proc/{pid}/ns/{name}") for name in NAMESPACES)]


def _powers(pid: int | str) -> tuple[int, int, int, tuple[int, int]]:
    """A process's effective capabilities, no_new_privs and seccomp mode (/proc/PID/status), and its root
    directory's identity (a chroot)."""
    fields = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("CapEff", "NoNewPrivs", "Seccomp"):
                fields[name] = value.strip()
    root = os.stat(f"/proc/{pid}/root")
    return (int(fields.get("CapEff", "0"), 16), int(fields.get("NoNewPrivs", "1")), int(fields.get("Seccomp", "2")),
            (root.st_dev, root.st_ino))


def _peer_pidfd(sock: _socket.socket, pid: int) -> int:
    try:
        return int(sock.getsockopt(_socket.SOL_SOCKET, SO_PEERPIDFD))
    except OSError as error:
        if error.errno != errno.ENOPROTOOPT:
            raise
    return os.pidfd_open(pid)  # an older kernel: the PID's process now, which a quick reuse could make another


def peer_refusal(sock: _socket.socket, who: str) -> str | None:
    """Why the process at the other end of `sock` is not root with all our powers, None when it is: root,
    in every namespace of ours, with at least our capabilities, no seccomp filter or no_new_privs we lack,
    the same root directory. Both ends ask it, the helper of its caller
    (a worker acts with its capabilities) and the caller of the listener (it starts what the helper asks).
    The checks read /proc by PID, then a pidfd of the peer itself proves the PID was still the peer's."""
    peer = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    pid, uid = (int.from_bytes(peer[at:at + 4], sys.byteorder) for at in (0, 4))
    if uid != 0:
        return f"{who} uid {uid}"
    try:
        pidfd = _peer_pidfd(sock, pid)
    except OSError:
        return f"{who} gone"
    try:
        if _namespace_ids(pid) != _namespace_ids("self"):
            return f"{who} in other namespaces"
        capabilities, no_new_privs, seccomp, root = _powers(pid)
        own_capabilities, own_no_new_privs, own_seccomp, own_root = _powers("self")
        if capabilities & own_capabilities != own_capabilities:
            return f"{who} has fewer capabilities"
        if no_new_privs > own_no_new_privs or (seccomp and not own_seccomp) or root != own_root:
            return f"{who} is confined (no_new_privs, seccomp or another root directory)"
        _signal.pidfd_send_signal(pidfd, 0)  # still the process that connected (or listened): what we read was its
    except OSError:
        return f"{who} gone"
    finally:
        os.close(pidfd)
    return None


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
    """The helper's connection, or None (not listening, or a listener with fewer powers than ours)."""
    if os.environ.get(RESIDENT_ENV) == "0":
        return None
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    except OSError:
        return None
    try:
        sock.connect(socket_path())
        # The socket's directory keeps out other users, not a root with fewer capabilities: it could listen
        # there itself and have us start what it likes
        if peer_refusal(sock, "helper") is not None:
            raise OSError("not the helper")
    except OSError:
        sock.close()
        return None
    return _Connection(sock)


def _inherited_fds(keep: list[int]) -> list[int]:
    """Our fds from 3 up that a program would inherit, less `keep`."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and fd not in keep and os.get_inheritable(fd):
                fds.append(fd)
        except OSError:
            pass  # listdir's own, closed by now
    return fds


def _spawn(request: tuple, fds: list[int]) -> tuple[tuple, list[int]]:
    """Start the program a worker asked for; ("spawned", pid) and its pidfd, or ("failed", errno, text).
    A program it runs for its output gets only its stdio (subprocess's close_fds), the delegate every fd
    of ours (the engine's for it); each its signals at their defaults, as subprocess gives them."""
    _, argv, env, targets, close_others = request
    try:
        actions: list[tuple] = [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(fds, targets, strict=True)]
        if close_others:
            actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited_fds(targets)]
        pid = os.posix_spawnp(argv[0], argv, env, file_actions=actions, setsigdef=DEFAULT_SIGNALS)
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
        if message[0] == "spawn" and len(message) == 5:
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


def _wait_for_children() -> None:
    """The programs we started for a worker that died, run to their ends: the engine must not see us end
    while the delegate it called us for (a restore) still works."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


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
        connection.sock.close()
        return None
    try:
        connection.send(("call", PROTOCOL, package_identity(), sys.argv[0], argv, dict(os.environ), umask,
                         delegate, hook), [0, 1, 2, cwd])
        connection.sock.settimeout(FIRST_ANSWER_TIMEOUT_S)  # a stopped or hung helper: ours to work
        message, fds = connection.receive()
        connection.sock.settimeout(None)
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
        for name in FORWARDED:  # the worker's PID is nobody's, or soon another's
            _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
        _wait_for_children()
        from gpuckpt.shim.argv import parse_runtime_args  # deferred: only for this error
        from gpuckpt.shim.log import report_error

        report_error(parse_runtime_args(argv), "gpuckpt-runtime: the resident helper (gpuckpt-runtimed) ended "
                                               "before the verb did; see its journal")
        return 1
