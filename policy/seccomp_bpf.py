"""Seccomp filter programs (classic BPF) as the kernel runs them: what a chain returns for a syscall.

Phases: decode a program (8-byte `sock_filter` instructions, only the opcodes seccomp accepts),
run it on a `seccomp_data` (nr, arch, instruction pointer, six arguments; 64 bytes), every jump
forward and every load inside the data, and combine a chain's results the kernel's way (the
action of highest precedence wins, so every filter must allow). For the policy, what a syscall
number leaves open (the instruction pointer, the arguments) stays open: every path a filter can
take is followed (`may_allow`). A program the kernel would refuse is an ImageError.
"""

from __future__ import annotations

import struct

from gpuckpt.errors import ImageError

AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_DATA_BYTES = 64
MAX_INSNS = 4096                 # BPF_MAXINSNS
RET_ACTION_FULL = 0xFFFF0000
RET_ALLOW, RET_LOG, RET_TRACE, RET_USER_NOTIF = 0x7FFF0000, 0x7FFC0000, 0x7FF00000, 0x7FC00000
NR_AND_ARCH_BYTES = 8            # what a syscall number fixes in seccomp_data; the rest may be anything
MEMORY_WORDS = 16                # BPF_MEMWORDS

_ALU = {0x00: lambda a, b: a + b, 0x10: lambda a, b: a - b, 0x20: lambda a, b: a * b,
        0x30: lambda a, b: a // b if b else None, 0x40: lambda a, b: a | b, 0x50: lambda a, b: a & b,
        0x60: lambda a, b: a << (b & 31), 0x70: lambda a, b: a >> (b & 31), 0xA0: lambda a, b: a ^ b}
_JUMPS = {0x10: lambda a, b: a == b, 0x20: lambda a, b: a > b, 0x30: lambda a, b: a >= b,
          0x40: lambda a, b: bool(a & b)}


def seccomp_data(nr: int, arch: int = AUDIT_ARCH_X86_64, args: tuple[int, ...] = (0,) * 6) -> bytes:
    return struct.pack("<iIQ6Q", nr, arch, 0, *args)


def decode(program: bytes, what: str) -> list[tuple[int, int, int, int]]:
    if not program or len(program) % 8 or len(program) // 8 > MAX_INSNS:
        raise ImageError(f"{what}: a seccomp program of {len(program)} bytes (1 to {MAX_INSNS} 8-byte instructions)")
    return list(struct.iter_unpack("<HBBI", program))


MAX_STATES = 1 << 16  # paths explored for one syscall, at most


def outcomes(program: list[tuple[int, int, int, int]], data: bytes, what: str,
             known_bytes: int = SECCOMP_DATA_BYTES) -> set[int]:
    """Every value the program can return for `data` whose first `known_bytes` are fixed and the
    rest (the instruction pointer, the arguments) may be anything: a jump on a value that depends
    on them follows both branches, and `ret a` of such a value counts as allowing."""
    results: set[int] = set()
    Value = int | None  # None: depends on what `data` leaves open
    pending: list[tuple[int, Value, Value, tuple[Value, ...]]] = [(0, 0, 0, (0,) * MEMORY_WORDS)]
    seen: set[tuple[int, Value, Value, tuple[Value, ...]]] = set()
    while pending:
        state = pending.pop()
        if state in seen:
            continue
        seen.add(state)
        if len(seen) > MAX_STATES:
            raise ImageError(f"{what}: seccomp program has more than {MAX_STATES} paths to check")
        pc, a, x, memory_words = state
        memory = list(memory_words)
        while True:
            if pc >= len(program):
                raise ImageError(f"{what}: seccomp program runs past its end")
            code, jt, jf, k = program[pc]
            klass = code & 0x07
            if code == 0x20:                                   # ld [k]
                if k % 4 or k + 4 > SECCOMP_DATA_BYTES:
                    raise ImageError(f"{what}: seccomp program loads seccomp_data at byte {k}")
                a = struct.unpack_from("<I", data, k)[0] if k + 4 <= known_bytes else None
            elif code == 0x80:                                 # ld len
                a = SECCOMP_DATA_BYTES
            elif code == 0x81:                                 # ldx len
                x = SECCOMP_DATA_BYTES
            elif code in (0x00, 0x01):                         # ld #k, ldx #k
                a, x = (k, x) if code == 0x00 else (a, k)
            elif code in (0x60, 0x61, 0x02, 0x03):             # ld M[k], ldx M[k], st M[k], stx M[k]
                if k >= MEMORY_WORDS:
                    raise ImageError(f"{what}: seccomp program uses scratch word {k}")
                if code == 0x60:
                    a = memory[k]
                elif code == 0x61:
                    x = memory[k]
                else:
                    memory[k] = a if code == 0x02 else x
            elif klass == 0x04:                                # alu
                operation = code & 0xF0
                operand = x if code & 0x08 else k
                if code == 0x84:
                    a = None if a is None else -a & 0xFFFFFFFF
                elif operation in _ALU:
                    if operation == 0x30 and operand in (0, None):
                        results.add(0)  # division by zero ends the program with 0 (kill)
                        if operand == 0:
                            break
                    result = None if a is None or operand is None else _ALU[operation](a, operand)
                    a = None if result is None else result & 0xFFFFFFFF
                else:
                    raise ImageError(f"{what}: seccomp program has opcode {code:#x}")
            elif klass == 0x05:                                # jumps
                if code == 0x05:
                    pc += k
                elif code & 0xF0 in _JUMPS:
                    operand = x if code & 0x08 else k
                    if a is None or operand is None:           # either way: both are followed
                        pending.append((pc + 1 + jf, a, x, tuple(memory)))
                        pc += jt
                    else:
                        pc += jt if _JUMPS[code & 0xF0](a, operand) else jf
                else:
                    raise ImageError(f"{what}: seccomp program has opcode {code:#x}")
            elif code == 0x06:                                 # ret #k
                results.add(k)
                break
            elif code == 0x16:                                 # ret a
                results.add(RET_ALLOW if a is None else a)
                break
            elif code == 0x07:                                 # tax
                x = a
            elif code == 0x87:                                 # txa
                a = x
            else:
                raise ImageError(f"{what}: seccomp program has opcode {code:#x}")
            pc += 1
    return results


def allows(action: int) -> bool:
    """The syscall goes ahead: allowed, logged, or handed to a tracer or a notifier, which may let
    it (a tracer in the container, a listener the restored process holds)."""
    return action in (RET_ALLOW, RET_LOG, RET_TRACE, RET_USER_NOTIF)


def may_allow(programs: list[list[tuple[int, int, int, int]]], nr: int, what: str,
              arch: int = AUDIT_ARCH_X86_64) -> bool:
    """Whether some instruction pointer and arguments let syscall `nr` through the whole chain: the
    kernel keeps the action of highest precedence, so each filter must have a path that allows it."""
    data = seccomp_data(nr, arch)
    return all(any(allows(action & RET_ACTION_FULL) for action in outcomes(program, data, what, NR_AND_ARCH_BYTES))
               for program in programs)
