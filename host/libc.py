"""The one ctypes binding of libc: the calls Python's os module lacks (ptrace; setns before 3.12; openat2)."""

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
        loaded.syscall.restype = ctypes.c_long
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


SYS_OPENAT2 = 437  # the same number on every architecture (added after the tables were unified)
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT = 0x01, 0x02, 0x10


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dir_fd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """openat2(2) (Linux 5.6): `path` opened from `dir_fd` under the `resolve` rules; a new descriptor."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    return _checked(_loaded().syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), os.fsencode(path),
                                      ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how))))


RESOLVE_NO_SYMLINKS = 0x04
AT_EMPTY_PATH = 0x1000


def link_descriptor(fd: int, dir_fd: int, name: str) -> None:
    """linkat(fd, "", dir_fd, name, AT_EMPTY_PATH): a new name for the file open at `fd` (an O_PATH
    descriptor will do; CAP_DAC_READ_SEARCH), with no path to it looked up at all."""
    libc = _loaded()
    _checked(libc.linkat(ctypes.c_int(fd), b"", ctypes.c_int(dir_fd), os.fsencode(name), ctypes.c_int(AT_EMPTY_PATH)))
