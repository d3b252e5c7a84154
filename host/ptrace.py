"""System calls run inside another process through ptrace (libc's, host/libc.py).

The caller stops one thread of the target (PTRACE_SEIZE + PTRACE_INTERRUPT), saves its
registers, points it at a `syscall` instruction the target already has mapped (its vDSO or
libc: nothing is written into the target), steps over it once per call, then puts the saved
registers back and detaches. A system call the thread was blocked in is restarted by the
kernel as after any ptrace stop (the saved registers keep its number and restart code), as
gdb and CRIU's parasite rely on. x86_64 only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

from ..errors import GpuckptError
from . import libc
from .procfs import start_time

PTRACE_SINGLESTEP, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 9, 12, 13, 17
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000
SYSCALL_INSTRUCTION = b"\x0f\x05"
SYS_CLOSE, SYS_MUNMAP = 3, 11
MAX_TEXT_SCAN_BYTES = 64 << 20
STOP_TIMEOUT_S = 5.0


class RemoteCallError(GpuckptError):
    """A system call could not be run inside another process."""


class UserRegs(ctypes.Structure):
    """x86_64 `struct user_regs_struct`, in the kernel's order."""

    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi",
        "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs")]


def _ptrace(request: int, pid: int, address: int = 0, data: int | ctypes.c_void_p | None = 0) -> int:
    return libc.ptrace(request, pid, address, data)


def _wait_stop(pid: int) -> tuple[int, int]:
    """(signal, ptrace event) of the next stop of `pid`, within STOP_TIMEOUT_S: a thread in an
    uninterruptible wait (a vfork parent, a call held by a seccomp notifier) never stops, and the
    container must not hang the caller so. Left seized then; the kernel lets it go when we exit."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while True:
        waited, status = os.waitpid(pid, WALL | os.WNOHANG)
        if waited:
            break
        if time.monotonic() > deadline:
            raise RemoteCallError(f"process {pid} did not stop within {STOP_TIMEOUT_S:.0f} s (an uninterruptible "
                                  "wait, such as a vfork parent's)")
        time.sleep(0.001)
    if not os.WIFSTOPPED(status):
        raise RemoteCallError(f"process {pid} ended while stopped for a remote system call")
    return os.WSTOPSIG(status), (status >> 16) & 0xFFFF


def find_syscall_instruction(pid: int) -> int:
    """The address of a `syscall` instruction in the target's vDSO, else in its libc's text."""
    candidates: list[tuple[int, int]] = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 5 or "x" not in fields[1]:
                continue
            start, end = (int(part, 16) for part in fields[0].split("-"))
            path = fields[5] if len(fields) > 5 else ""
            if path == "[vdso]":
                candidates.insert(0, (start, end))
            elif "libc" in os.path.basename(path):
                candidates.append((start, end))
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        for start, end in candidates:
            text = os.pread(fd, min(end - start, MAX_TEXT_SCAN_BYTES), start)
            if (offset := text.find(SYSCALL_INSTRUCTION)) >= 0:
                return start + offset
    finally:
        os.close(fd)
    raise RemoteCallError(f"process {pid} maps no syscall instruction (no vDSO, no libc) to run system calls through")


@contextmanager
def stopped_thread(pid: int) -> Iterator[list[int]]:
    """`pid`'s main thread held in a ptrace stop; yields a list the body fills with signals
    that arrived meanwhile, delivered again at detach."""
    try:
        _ptrace(PTRACE_SEIZE, pid)
    except OSError as error:
        why = "it is traced by another process" if error.errno == errno.EPERM else error.strerror
        raise RemoteCallError(f"cannot attach to process {pid}: {why}") from None
    pending: list[int] = []
    try:
        _ptrace(PTRACE_INTERRUPT, pid)
        stop_signal, event = _wait_stop(pid)
        if event != PTRACE_EVENT_STOP and stop_signal != signal.SIGTRAP:
            pending.append(stop_signal)  # a signal was on its way: it gets delivered at detach
            _ptrace(PTRACE_INTERRUPT, pid)
            _wait_stop(pid)
        yield pending
    finally:
        with suppress(OSError):  # the process is gone: nothing to give back
            _ptrace(PTRACE_DETACH, pid, 0, pending[0] if pending else 0)


def remote_syscalls(pid: int, started: int, calls: Sequence[tuple[int, ...]]) -> list[int]:
    """Run each (number, arg1, ...) inside `pid`, in order; their raw results (-errno on error).
    `started` is the process's start time when the caller chose it: once the thread is held,
    a process that ended meanwhile and left its PID to another is refused before any call."""
    if (machine := os.uname().machine) != "x86_64":
        raise RemoteCallError(f"remote system calls are implemented for x86_64 only, not {machine}")
    results = []
    with stopped_thread(pid) as pending:
        if start_time(pid) != started:
            raise RemoteCallError(f"process {pid} is not the one chosen (it ended and its PID was taken again)")
        instruction = find_syscall_instruction(pid)
        saved = UserRegs()
        _ptrace(PTRACE_GETREGS, pid, 0, ctypes.cast(ctypes.pointer(saved), ctypes.c_void_p))
        try:
            for number, *arguments in calls:
                regs = UserRegs.from_buffer_copy(saved)
                regs.rip, regs.rax, regs.orig_rax = instruction, number, 2**64 - 1  # -1: no syscall to restart
                # up to six arguments; registers past a call's last keep what they held
                for name, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), arguments, strict=False):
                    setattr(regs, name, value % 2**64)
                _ptrace(PTRACE_SETREGS, pid, 0, ctypes.cast(ctypes.pointer(regs), ctypes.c_void_p))
                results.append(_step_syscall(pid, instruction, pending))
        finally:
            _ptrace(PTRACE_SETREGS, pid, 0, ctypes.cast(ctypes.pointer(saved), ctypes.c_void_p))
    return results


def _step_syscall(pid: int, instruction: int, pending: list[int]) -> int:
    """Step over the syscall instruction; a signal arriving first is kept for the detach."""
    after = UserRegs()
    for _ in range(16):
        _ptrace(PTRACE_SINGLESTEP, pid)
        stop_signal, _ = _wait_stop(pid)
        _ptrace(PTRACE_GETREGS, pid, 0, ctypes.cast(ctypes.pointer(after), ctypes.c_void_p))
        if after.rip == instruction + len(SYSCALL_INSTRUCTION):
            return ctypes.c_longlong(after.rax).value
        if stop_signal != signal.SIGTRAP:
            pending.append(stop_signal)
    raise RemoteCallError(f"process {pid} did not run the remote system call (signals kept arriving)")
