"""An owned verb handed to gpuckpt-runtimed, the resident helper (shim/resident/server.py), when it listens.

Importing pydantic, cryptography and the verbs' models costs a fresh interpreter ~300 ms per call;
the helper has them loaded and forks a worker per verb. This side stays the process the engine
started: it sends its argv, environment, umask, working directory and stdio, starts the programs
the worker asks for (shim/resident/caller.py: they must be this process's children), passes on the signals
it gets, and exits with the worker's status (the compiled launcher does the same in C without starting
Python: shim/resident/resident_call.c). Loaded on every owned verb before anything heavy, so
it imports only built-in modules (`socket` alone costs ~9 ms; `_socket` nothing).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # built-in; `signal` (enum) costs ~6 ms
import _socket
import os
import sys

from ...node.paths import state_dir
from . import messages
from .messages import PeerGone, peer_refusal

TYPE_CHECKING = False  # typing costs an import on every owned verb's start
if TYPE_CHECKING:
    from .messages import Message

SOCKET_NAME = "runtime.sock"
PROTOCOL = 1
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH")
# Set to 0 by a caller that wants the verb worked in its own process (tests of that path, a debugger).
RESIDENT_ENV = "GPUCKPT_RESIDENT"
# The helper's worker answers within its own hello timeout (10 s) or never; past this we work the verb. A worker
# whose answer comes after we closed sees its first request fail and does nothing more.
FIRST_ANSWER_TIMEOUT_S = 15.0
# What subprocess's restore_signals puts back for a child: Python ignores them, a program expects them.
DEFAULT_SIGNALS = ("SIGPIPE", "SIGXFSZ")
# The call, the first message, field by field in the order sent ("call" first); shim/resident/server.py reads them in
# this order and the compiled launcher writes them in it (shim/resident/contract.py generates its list from this one).
CALL_FIELDS = ("kind", "protocol", "identity", "program", "argv", "environment", "umask", "delegate", "hook")
# The compiled launcher and this module are held to one contract: shim/resident/contract.py generates the C side's
# constants from this module's, tests/test_launcher_contract.py compares the calls both send.


def socket_path() -> str:
    return os.path.join(state_dir(), SOCKET_NAME)


def helper_listens() -> bool:
    """Whether a gpuckpt-runtimed listens on the socket (a probe: connected, then closed without a word)."""
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    try:
        probe.connect(socket_path())
        return True
    except OSError:
        return False
    finally:
        probe.close()


def listener_refusal() -> str | None:
    """Why an owned verb would not go to the socket's listener (nothing listens, or peer_refusal's reason, as
    _connect asks it); None when it would. A probe: connected, then closed without a word."""
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    try:
        probe.connect(socket_path())
    except OSError as error:
        probe.close()
        return f"nothing listens ({error.strerror})"
    try:
        return peer_refusal(probe, "its listener")
    finally:
        probe.close()


def package_identity() -> str:
    """Which installed gpuckpt this is: a helper running another one's code must not work our verbs."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))  # the package: this is shim/resident/call.py
    status = os.stat(os.path.join(here, "shim", "main.py"))
    return f"{os.path.realpath(here)}:{status.st_ino}:{status.st_mtime_ns}"


def _connect() -> _socket.socket | None:
    """The helper's connection, or None (not listening, or a listener with fewer powers than ours)."""
    if os.environ.get(RESIDENT_ENV) == "0":
        return None
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    except OSError:
        return None
    try:
        sock.setblocking(False)  # a listener whose queue is full (stopped, hung) is refused at once, not waited for
        sock.connect(socket_path())
        sock.setblocking(True)
        # The socket's directory keeps out other users, not a root with fewer capabilities: it could listen
        # there itself and have us start what it likes
        if peer_refusal(sock, "helper") is not None:
            raise OSError("not the helper")
    except OSError:
        sock.close()
        return None
    return sock


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


def _spawn(request: Message, fds: list[int]) -> tuple[Message, list[int]]:
    """Start the program a worker asked for; ("spawned", pid) and its pidfd, or ("failed", errno, text).
    A program it runs for its output gets only its stdio (subprocess's close_fds), the delegate every fd
    of ours (the engine's for it); each its signals at their defaults, as subprocess gives them."""
    _, argv, env, targets, close_others = request
    try:
        actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, fd, target)
                                          for fd, target in zip(fds, targets, strict=True)]
        if close_others:
            actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited_fds(targets)]
        pid = os.posix_spawnp(argv[0], argv, env, file_actions=actions,
                              setsigdef=[getattr(_signal, name) for name in DEFAULT_SIGNALS])
    except (OSError, ValueError, TypeError) as error:
        number = getattr(error, "errno", None) or 22
        return ("failed", number, getattr(error, "strerror", None) or str(error)), []
    finally:
        for fd in fds:
            os.close(fd)
    try:
        return ("spawned", pid), [os.pidfd_open(pid)]
    except OSError as error:  # started, but the worker could not watch it: ended here, as if it never ran
        os.kill(pid, _signal.SIGKILL)
        os.waitpid(pid, 0)
        return ("failed", error.errno, error.strerror), []


def _serve(connection: _socket.socket) -> int:
    """Start and reap what the worker asks for until it says its exit status."""
    while True:
        message, fds = messages.receive(connection)
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
            raise PeerGone()
        try:
            messages.send(connection, answer, answer_fds)
        except OSError:
            raise PeerGone() from None
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
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        return None  # closed: our socket would take its number and go to the worker as our stdio
    connection = _connect()
    if connection is None:
        return None
    worker = _hand_over(connection, argv, delegate, hook)
    if worker is None:
        return None
    return _serve_forwarding(connection, worker, argv)


def _hand_over(connection: _socket.socket, argv: list[str], delegate: str, hook: str) -> int | None:
    """The call sent with our stdio and working directory; the worker's PID, or None where the helper
    leaves the verb to us (nothing was done)."""
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        connection.close()
        return None
    # os.environ as getenv() has it; a nameless entry ("=x", which execve takes) is no variable (the compiled
    # launcher leaves it out too) and a worker could not set it
    fields = {"kind": "call", "protocol": PROTOCOL, "identity": package_identity(), "program": sys.argv[0],
              "argv": argv, "environment": {name: value for name, value in os.environ.items() if name},
              "umask": umask, "delegate": delegate, "hook": hook}
    try:
        messages.send(connection, tuple(fields[name] for name in CALL_FIELDS), [0, 1, 2, cwd])
        connection.settimeout(FIRST_ANSWER_TIMEOUT_S)  # a stopped or hung helper: ours to work
        message, fds = messages.receive(connection)
        connection.settimeout(None)
    except (OSError, PeerGone):
        return None  # stdio closed, a message too big, the helper stopping: ours to work
    finally:
        os.close(cwd)
    for fd in fds:
        os.close(fd)
    if message[0] != "worker" or len(message) != 2:
        return None  # ("local", why): the helper cannot work this call in our place
    return int(message[1])


def _serve_forwarding(connection: _socket.socket, worker: int, argv: list[str]) -> int:
    """The worker's requests served, our signals passed on to it, until it reports the verb's exit status."""
    def forward(signum: int, _frame: object) -> None:
        try:  # noqa: SIM105 -- contextlib is not imported on the pass-through path
            os.kill(worker, signum)
        except OSError:  # gone already
            pass

    for name in FORWARDED:
        _signal.signal(getattr(_signal, name), forward)
    try:
        return _serve(connection)
    except PeerGone:
        for name in FORWARDED:  # the worker's PID is nobody's, or soon another's
            _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
        _wait_for_children()
        return report_worker_gone(argv)


def report_worker_gone(argv: list[str]) -> int:
    """The worker ended before the verb did (its programs have ended too): one line where the engine reads
    our errors; exit status 1. The compiled launcher runs it after its own call (shim/resident/resident_call.c)."""
    from ..argv import parse_runtime_args  # deferred: only for this error
    from ..log import report_error

    report_error(parse_runtime_args(argv), "gpuckpt-runtime: the resident helper's worker (gpuckpt-runtimed) "
                                           "ended before the verb did; see its journal: what the delegate finished "
                                           "is kept, and the next owned verb on the container (or gpuckpt recover) "
                                           "completes or rolls back the rest")
    return 1
