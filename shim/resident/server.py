"""`gpuckpt-runtimed`: the runtime's resident helper, which works owned verbs with their code loaded.

A fresh gpuckpt-runtime spends ~300 ms importing pydantic, cryptography and the verbs' models
before a checkpoint or a restore does anything (bench/owned_verbs.py). This process imports them
once, then listens on a SOCK_SEQPACKET socket (systemd's, gpuckpt-runtimed.socket, or its own in
the state directory) and keeps a worker forked and warmed ahead of each call (a spare, which accepts
the call itself; the helper then forks the next): the worker takes the caller's stdio, working
directory, umask and environment, works the verb as gpuckpt-runtime would, and has the caller
start every program (shim/resident/caller.py) so the delegate stays the engine's grandchild.

A worker takes the call only from a root process in our namespaces whose capabilities are all
ours, running the same installed gpuckpt; anything else is answered ("local", why) and the caller
works the verb itself. An install that changed our files ends this process at its next call
(systemd starts the new code at the one after).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...errors import GpuckptError
from ...host.netns import in_netns_of
from ...node.config import parse_config
from ...node.paths import state_dir
from ...oci import criu_images
from ...oci.spec import Spec
from ...oci.state import ContainerState
from ...trust.keys import load_trust
from ...trust.signature import SignedEntry, Signer, TrustedKey, open_envelope
from .. import main as shim_main
from ..argv import (
    OWNED_VALUE_FLAGS,
    OWNED_VERBS,
    RuntimeArgs,
    hidden_checkpoint_or_restore,
    owned_verb_is_only_asked_about,
    parse_runtime_args,
    parse_verb_args,
)
from . import caller, messages
from .call import PROTOCOL, SOCKET_NAME, package_identity
from .messages import peer_refusal

if TYPE_CHECKING:
    from .messages import Message

# What the owned verbs load, imported before the first fork (each worker then starts with it).
PRELOADED = ("gpuckpt.shim.checkpoint", "gpuckpt.shim.restore", "gpuckpt.shim.delete", "gpuckpt.shim.pause",
             "gpuckpt.shim.create", "gpuckpt.shim.log", "gpuckpt.oci.state", "gpuckpt.oci.problems",
             "gpuckpt.node.config", "json", "traceback", "tempfile")
HELLO_TIMEOUT_S = 10.0
JOURNAL_FD = 2  # until main() keeps a copy of the helper's own stderr there: a worker's fd 2 is its caller's
LISTEN_BACKLOG = 128
SPARE_TOOK_CALL, SPARE_REINSTALLED = b"w", b"r"  # what a spare worker tells the helper


class Refused(Exception):
    """Why a worker does not take a call (the caller then works it itself)."""


def check_peer(connection: socket.socket) -> None:
    """Refused unless the peer is root, in every namespace of ours, with at least our capabilities: a
    worker acts with ours, so a process with fewer, or in another mount or PID namespace (paths and
    PIDs it names would mean something else here), works its verb itself."""
    why = peer_refusal(connection, "caller")
    if why is not None:
        raise Refused(why)


def _hello(connection: socket.socket) -> tuple[Message, list[int]]:
    connection.settimeout(HELLO_TIMEOUT_S)
    try:
        message, fds = messages.receive(connection)
    except messages.NotAMessage:
        raise Refused("not a call this helper speaks") from None
    except messages.PeerGone:
        raise Refused("") from None  # closed without a word: a probe of whether we listen
    connection.settimeout(None)
    if not (len(message) == 9 and message[0] == "call" and message[1] == PROTOCOL
            and len(fds) == 4 and _strings(message[4]) and isinstance(message[5], dict)
            and _strings([*message[5], *message[5].values(), message[2], message[3], message[7], message[8]])
            and isinstance(message[6], int)):
        for fd in fds:
            os.close(fd)
        raise Refused("not a call this helper speaks")
    return message, fds


def _not_owned(args: RuntimeArgs) -> str:
    """Why the call is not one shim/main.py works as an owned verb ("" when it is): the caller's own parse
    decided to send it (the compiled launcher's in C), ours decides whether a worker takes it."""
    if args.command not in OWNED_VERBS or args.unknown_global is not None or \
            owned_verb_is_only_asked_about(args) or hidden_checkpoint_or_restore(args):
        return f"{args.command or 'no verb'} is not an owned verb's call"
    if any(arg == "--status-fd" or arg.startswith("--status-fd=") for arg in args.command_args):
        # a descriptor of the caller's that a worker does not have (it gets stdio and the cwd alone):
        # runc's lazy-migration handshake is kept in the caller's own process
        return f"{args.command} with --status-fd (a descriptor of the caller's) is the caller's"
    return ""


def _journal_line(text: str) -> None:
    """One line to the helper's own stderr (the journal under systemd), not the caller's."""
    os.write(JOURNAL_FD, f"gpuckpt-runtimed: {text}\n".encode(errors="replace"))


def _strings(values: object) -> bool:
    return isinstance(values, list) and all(isinstance(value, str) for value in values)


def _take_on(message: Message, fds: list[int]) -> tuple[list[str], str, str]:
    """Become the caller: its stdio, working directory, umask, environment and argv[0]."""
    _, _, _identity, argv0, argv, environment, umask, delegate, hook = message
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)  # inheritable, as the caller's own are
        os.close(fd)
    os.fchdir(fds[3])
    os.close(fds[3])
    os.umask(umask)
    os.environ.clear()
    os.environ.update(environment)
    sys.argv = [argv0, *argv]
    return argv, delegate, hook


def _watch_caller(connection: socket.socket) -> None:
    """The caller killed (its engine gave up): this worker is told as gpuckpt-runtime would be, by SIGTERM,
    so a verb holding CUDA processes locked rolls them back."""
    poller = select.poll()
    poller.register(connection.fileno(), select.POLLRDHUP)
    poller.poll()
    os.kill(os.getpid(), signal.SIGTERM)


def work(connection: socket.socket, identity: str) -> int:
    """One call, in a forked worker; its exit status is the caller's."""
    try:  # the peer was checked before the fork (serve): nothing a lesser peer sends is parsed
        message, fds = _hello(connection)
        if message[2] != identity:
            for fd in fds:
                os.close(fd)
            raise Refused("another gpuckpt install")
        args = parse_runtime_args(message[4])
        if why := _not_owned(args):
            for fd in fds:
                os.close(fd)
            raise Refused(why)
    except (Refused, OSError) as refused:
        if str(refused):
            _journal_line(f"a call left to its caller: {refused}")
        with contextlib.suppress(OSError):  # the caller gone: nobody to tell
            messages.send(connection, ("local", str(refused)))
        return 0
    argv, delegate, hook = _take_on(message, fds)
    messages.send(connection, ("worker", os.getpid()))
    caller.work_for(caller.Caller(connection))
    threading.Thread(target=_watch_caller, args=(connection,), daemon=True, name="gpuckpt-caller").start()
    started = time.monotonic()
    status = shim_main.work_owned(argv, delegate, hook)
    value_flags = OWNED_VALUE_FLAGS.get(args.command or "", frozenset())
    container = parse_verb_args(args.command_args, value_flags).container_id or "-"
    _journal_line(f"{args.command} {container} for pid {messages.peer_credentials(connection)[0]}: exit {status} "
                  f"in {time.monotonic() - started:.2f} s")
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the caller ends at our answer: no news for us
    messages.send(connection, ("exit", status))
    return 0


def _listener() -> socket.socket:
    """systemd's socket (LISTEN_FDS), or one of our own in the state directory."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
        for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(name, None)
        return socket.socket(fileno=3)
    directory = state_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    status = os.lstat(directory)
    if status.st_uid != os.geteuid() or status.st_mode & 0o022 or not os.path.isdir(directory) or \
            os.path.islink(directory):
        raise GpuckptError(f"gpuckpt-runtimed: {directory} is not root's alone; refusing to listen there")
    path = os.path.join(directory, SOCKET_NAME)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    bound: list[tuple[int, int]] = []

    def stop(_signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            status = os.lstat(path)
            if [(status.st_dev, status.st_ino)] == bound:  # not a later helper's, which took the path since
                os.unlink(path)  # our own socket goes with us: callers then find nothing to connect to
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a socket left by an earlier helper: nobody listens on it any more
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old_umask)
    status = os.lstat(path)
    bound.append((status.st_dev, status.st_ino))
    listener.listen(LISTEN_BACKLOG)
    return listener


def _preload(modules: Sequence[str]) -> None:
    for name in modules:
        importlib.import_module(name)
    with contextlib.suppress(GpuckptError):  # no python3-pycriu: each restore's check says so
        criu_images.criu_messages()  # CRIU's message modules, cached: a restore's image check reads them (~40 ms)
    gc.collect()
    gc.freeze()  # the loaded code stays shared with the workers instead of copied at their first collection


def _warm_up() -> None:
    """The first call of a library in a process initialises it (OpenSSL's key loading ~3 ms, a model's first
    JSON parse): a spare makes them before its call, on scratch data and no node state (~5 ms a verb)."""
    signer = Signer.from_pem(Signer.generate().pem(), "warm-up")
    envelope = signer.sign(signer.content("dump", [SignedEntry(name="x", size=0, mode=0o600, sha256=None)]))
    open_envelope(envelope, {signer.key_id: TrustedKey("warm-up", signer.public)}, "warm-up", "dump")
    in_netns_of(os.getpid(), lambda: None)  # a thread joining our own network namespace: a restore's loopback
    with contextlib.suppress(GpuckptError):
        load_trust()  # read, not kept: a verb reads it again
    hashlib.sha256(b"warm-up").hexdigest()
    parse_config('[criu]\nnetwork_lock = "nftables"\n', "warm-up")
    ContainerState.model_validate_json('{"ociVersion": "1.0.2", "id": "x", "pid": 1, "status": "running", '
                                       '"bundle": "/"}')
    Spec.model_validate(json.loads('{"ociVersion": "1.0.2", "process": {"args": ["x"]}}'))


def serve(listener: socket.socket) -> int:
    """Keep one spare worker forked and warmed ahead of the next call, which it accepts itself; a new spare
    as each one takes a call. Returns when a spare finds the installed gpuckpt changed."""
    identity = package_identity()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    failures = 0  # spares in a row that ended without a call
    while True:
        taken_read, taken_write = os.pipe()
        alive_read, alive_write = os.pipe()  # its end: our end, so an idle spare never outlives us
        pid = os.fork()
        if pid == 0:
            os.close(taken_read)
            os.close(alive_write)
            _spare(listener, identity, taken_write, alive_read)  # never returns
        os.close(taken_write)
        os.close(alive_read)
        try:
            taken = os.read(taken_read, 1)
        except InterruptedError:
            taken = b""
        os.close(taken_read)
        os.close(alive_write)
        if taken == SPARE_REINSTALLED:
            return 0
        if taken == SPARE_TOOK_CALL:
            failures = 0
            continue
        # It ended without taking a call: for a while (longer as more fail in a row, not a loop of forks),
        # the calls that come are answered here. Each holds its caller's stdio (in the message no one has
        # read): it lets it go and works its verb at once, not after 15 s, and its engine sees its output end.
        failures += 1
        _leave_calls_to_callers(listener, min(0.1 * 2 ** min(failures, 6), 5.0))


def _leave_calls_to_callers(listener: socket.socket, for_s: float) -> None:
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    deadline = time.monotonic() + for_s
    while poller.poll(max(deadline - time.monotonic(), 0) * 1000):
        try:
            connection, _ = listener.accept()
        except OSError:
            return  # none to take after all, or no fd for it: the next spare's
        with connection, contextlib.suppress(OSError):
            messages.send(connection, ("local", "no worker ready"))


def _spare(listener: socket.socket, identity: str, taken: int, alive: int) -> None:
    """A worker before its call: warmed (the pages a verb touches copied now, not on the caller's time),
    it accepts the next call whose peer has our powers, tells the helper, and works it."""
    status = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the standalone helper's handler: the socket is not ours
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            _warm_up()
        except Exception as error:  # noqa: BLE001 - a speed-up: a spare that could not warm up still works calls
            _journal_line(f"a spare worker's warm-up failed: {error}")
        connection = _accept_checked(listener, identity, alive)
        if connection is None:
            os.write(taken, SPARE_REINSTALLED)
            os._exit(0)
        os.write(taken, SPARE_TOOK_CALL)
        os.close(taken)
        os.close(alive)
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a worker's signals are a fresh gpuckpt-runtime's
        signal.signal(signal.SIGINT, signal.default_int_handler)
        status = work(connection, identity)
    except BaseException:  # noqa: BLE001 - a worker's end is os._exit's, never the server's loop
        status = 1
    finally:
        os._exit(status)


def _accept_checked(listener: socket.socket, identity: str, alive: int) -> socket.socket | None:
    """The next call from a peer with all our powers (a lesser one is answered "local" here, no worker for it,
    however many); None when gpuckpt was reinstalled. Ends this process when the helper has ended."""
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    poller.register(alive, select.POLLIN)  # EOF: the helper is gone
    while True:
        if any(fd == alive for fd, _ in poller.poll()):
            os._exit(0)
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            continue
        if package_identity() != identity:  # reinstalled: this call is the caller's, the next the new code's
            connection.close()
            return None
        try:  # its PID has had no time to be reused
            check_peer(connection)
        except Refused as refused:
            if not str(refused).endswith("gone"):
                with contextlib.suppress(OSError):
                    messages.send(connection, ("local", str(refused)))
                _journal_line(f"a call left to its caller: {refused}")
            connection.close()
            continue
        return connection


def build_parser() -> argparse.ArgumentParser:
    """gpuckpt-runtimed's command line: --help only (its manual page is made from it, cli/manual.py)."""
    return argparse.ArgumentParser(
        prog="gpuckpt-runtimed",
        description="gpuckpt-runtime's resident helper: it keeps the checkpoint and restore code loaded and a worker "
                    "warmed, so an owned verb does not pay the interpreter's imports each call. Started by systemd "
                    "(gpuckpt-runtimed.socket); it takes no arguments. Without it, gpuckpt-runtime works the verb "
                    "itself.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:  # --help prints the help its manual page lists (exit 0); anything else is a usage error (exit 2)
        build_parser().parse_args(argv)
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    try:
        listener = _listener()
    except (GpuckptError, OSError) as error:
        sys.stderr.write(f"{error}\n")
        return 1
    global JOURNAL_FD
    JOURNAL_FD = os.dup(2)  # inherited by workers (not by what they start: dup's copy is close-on-exec)
    _preload(PRELOADED)
    return serve(listener)


if __name__ == "__main__":
    sys.exit(main())
