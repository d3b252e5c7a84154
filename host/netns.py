"""A container's network namespace, entered by one thread of ours (the others stay where they are)."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from collections.abc import Callable
from typing import TypeVar

from . import libc
from .background import OnThread

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
IFF_UP = 0x1
IFREQ = struct.Struct("16sH22x")  # struct ifreq: the name, then ifr_flags in its 24-byte union

T = TypeVar("T")


def in_netns_of(pid: int, action: Callable[[], T]) -> T:
    """`action()` run in a thread joined to the network namespace of process `pid`, through a pidfd (from
    its opening on, the process cannot be swapped for another; a PID reused before it is not caught, so
    an action must be harmless in any namespace, as setting an `lo` up is)."""

    def joined() -> T:
        pidfd = os.pidfd_open(pid)
        try:
            libc.setns(pidfd, CLONE_NEWNET)
        finally:
            os.close(pidfd)
        return action()

    return OnThread(joined, f"netns-{pid}").result()


def loopback_up() -> bool:
    """In the current thread's network namespace: set `lo` up; False if it already was."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        flags = IFREQ.unpack(fcntl.ioctl(probe, SIOCGIFFLAGS, IFREQ.pack(b"lo", 0)))[1]
        if flags & IFF_UP:
            return False
        fcntl.ioctl(probe, SIOCSIFFLAGS, IFREQ.pack(b"lo", flags | IFF_UP))
        return True
