"""The resident helper's wire (shim/resident/server.py, shim/resident/call.py, shim/resident/caller.py, and in C
shim/resident/resident_call.c): marshal'd tuples with fds on a SOCK_SEQPACKET socket, and the check each
end makes of the other. Both ends are root; a peer that is not root with all our powers is refused
before anything it sends is parsed. Built-in modules only: the calling gpuckpt-runtime loads this
before anything else.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # built-in; `signal` (enum) costs ~6 ms
import _socket
import errno
import marshal
import os
import sys

TYPE_CHECKING = False  # typing costs an import on every owned verb's start
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TypeAlias

    # A marshal'd tuple: its fields are whatever the peer sent, each checked where it is read
    Message: TypeAlias = tuple[Any, ...]

# Version 2 writes no back-references: the compiled launcher (shim/resident/resident_call.c) reads what we send
MARSHAL_VERSION = 2
MAX_MESSAGE = 1 << 20  # a message's bound either way: argv and environment
FD_BYTES = 4
MAX_FDS = 4  # the most one message carries: the caller's stdio and working directory
NAMESPACES = ("mnt", "pid", "net", "user", "ipc", "uts", "cgroup")
# A /proc/PID/status field peer_refusal reads, where it is missing: the most confined
POWERS_IF_MISSING = {"CapEff": "0", "NoNewPrivs": "1", "Seccomp": "2"}
SO_PEERPIDFD = 77  # Linux 6.5: the peer process itself, where SO_PEERCRED's PID may since be another's


class PeerGone(Exception):
    """The other end closed, timed out, or sent what is not a message of ours."""


class NotAMessage(PeerGone):
    """What came is not a marshal'd, non-empty tuple."""


def pack_fds(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
    """SCM_RIGHTS ancillary data carrying `fds` (none: no ancillary data)."""
    if not fds:
        return []
    data = b"".join(fd.to_bytes(FD_BYTES, sys.byteorder, signed=True) for fd in fds)
    return [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, data)]


def unpack_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The fds an SCM_RIGHTS message carried (a truncated last one dropped)."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(data[at:at + FD_BYTES], sys.byteorder, signed=True)
                    for at in range(0, len(data) - len(data) % FD_BYTES, FD_BYTES)]
    return fds


def send(sock: _socket.socket, message: Message, fds: Sequence[int] = ()) -> None:
    sock.sendmsg([marshal.dumps(message, MARSHAL_VERSION)], pack_fds(fds))


def receive(sock: _socket.socket) -> tuple[Message, list[int]]:
    """The next message and the fds it carried (close-on-exec); PeerGone at the end, a timeout, or garbage."""
    try:
        data, ancillary, _flags, _ = sock.recvmsg(MAX_MESSAGE, _socket.CMSG_SPACE(FD_BYTES * MAX_FDS),
                                                  _socket.MSG_CMSG_CLOEXEC)
    except OSError:
        raise PeerGone() from None
    fds = unpack_fds(ancillary)
    try:
        message = marshal.loads(data) if data else None
    except (ValueError, EOFError, TypeError):
        message = None
    if not isinstance(message, tuple) or not message:
        for fd in fds:
            os.close(fd)
        raise NotAMessage() if data else PeerGone()
    return message, fds


def _namespace_ids(pid: int | str) -> list[tuple[int, int]]:
    return [(status.st_dev, status.st_ino) for status in
            (os.stat(f"/proc/{pid}/ns/{name}") for name in NAMESPACES)]


def _powers(pid: int | str) -> tuple[int, int, int, tuple[int, int]]:
    """A process's effective capabilities, no_new_privs and seccomp mode (/proc/PID/status), and its root
    directory's identity (a chroot)."""
    fields = {}
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:  # Name: is the process's own
        for line in status:
            name, _, value = line.partition(":")
            if name in POWERS_IF_MISSING:
                fields[name] = value.strip()
    root = os.stat(f"/proc/{pid}/root")
    read = {**POWERS_IF_MISSING, **fields}
    return int(read["CapEff"], 16), int(read["NoNewPrivs"]), int(read["Seccomp"]), (root.st_dev, root.st_ino)


def _peer_pidfd(sock: _socket.socket, pid: int) -> int:
    try:
        return int(sock.getsockopt(_socket.SOL_SOCKET, SO_PEERPIDFD))
    except OSError as error:
        if error.errno != errno.ENOPROTOOPT:
            raise
    return os.pidfd_open(pid)  # an older kernel: the PID's process now, which a quick reuse could make another


def peer_credentials(sock: _socket.socket) -> tuple[int, int]:
    """The peer's PID and uid as the kernel saw them at connect (listen, for a client's peer)."""
    peer = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    pid, uid = (int.from_bytes(peer[at:at + 4], sys.byteorder) for at in (0, 4))
    return pid, uid


def peer_refusal(sock: _socket.socket, who: str) -> str | None:
    """Why the process at the other end of `sock` is not root with all our powers, None when it is: root,
    in every namespace of ours, with at least our capabilities, no seccomp filter or no_new_privs we lack,
    the same root directory. Both ends ask it, the helper of its caller
    (a worker acts with its capabilities) and the caller of the listener (it starts what the helper asks).
    The checks read /proc by PID, then a pidfd of the peer itself proves the PID was still the peer's."""
    pid, uid = peer_credentials(sock)
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
