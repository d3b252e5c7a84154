"""The one ctypes binding of libc: the calls Python's os module lacks (ptrace; setns before 3.12)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_libc: ctypes.CDLL | None = None


def _loaded() -> ctypes.CDLL:
    global _libc
    if _libc is None:  # typed in full before any thread can see it
        loaded = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        loaded.ptrace.restype = ctypes.c_long
        loaded.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        loaded.setns.restype = ctypes.c_int
        loaded.setns.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = loaded
    return _libc


def _checked(result: int) -> int:
    if result == -1 and (code := ctypes.get_errno()):
        raise OSError(code, os.strerror(code))
    return result


def ptrace(request: int, pid: int, address: int = 0, data: int | ctypes.c_void_p | None = 0) -> int:
    return _checked(_loaded().ptrace(request, pid, ctypes.c_void_p(address), data))


def setns(fd: int, nstype: int) -> None:
    """setns(2) for the calling thread: os.setns where Python has it (3.12), libc's otherwise."""
    if hasattr(os, "setns"):
        os.setns(fd, nstype)
    else:
        _checked(_loaded().setns(fd, nstype))
