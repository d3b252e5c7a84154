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

from ..errors import ImageError

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


MAX_STATES = 1 << 16  # paths explored for one syscall (or one group of them), at most
MAX_STEPS = 1 << 18   # instructions run in one walk, at most: podman's filters take ~750 for all 49 syscalls


class _Nr:
    """A value: the syscall number, whichever of its path's candidates it is."""

    def __repr__(self) -> str:
        return "NR"


NR = _Nr()
Value = int | _Nr | None  # None: depends on what `data` leaves open
State = tuple[int, Value, Value, tuple[Value, ...], frozenset[int]]


def outcomes(program: list[tuple[int, int, int, int]], data: bytes, what: str,
             known_bytes: int = SECCOMP_DATA_BYTES) -> set[int]:
    """Every value the program can return for `data` whose first `known_bytes` are fixed and the
    rest (the instruction pointer, the arguments) may be anything: a jump on a value that depends
    on them follows both branches, and `ret a` of such a value counts as allowing."""
    return _explore(program, data, what, known_bytes, None)[None]


def outcomes_by_syscall(program: list[tuple[int, int, int, int]], numbers: set[int], what: str,
                        arch: int = AUDIT_ARCH_X86_64) -> dict[int, set[int]]:
    """outcomes() with only the number and arch known, for many syscall numbers in one exploration:
    a path is shared until the program tells the numbers apart (a filter's chain of `jeq nr` is walked
    once, not once per number)."""
    if not all(0 <= number < 1 << 31 for number in numbers):
        raise ValueError(f"syscall numbers are 0 to 2^31-1, not {sorted(numbers)}")
    found = _explore(program, seccomp_data(0, arch), what, NR_AND_ARCH_BYTES, frozenset(numbers))
    return {number: found[number] for number in numbers}


def _with_number(state: State, number: int) -> State:
    """`state` for one of its syscall numbers, NR replaced by it wherever it is held."""
    pc, a, x, memory, _ = state

    def concrete(value: Value) -> Value:
        return number if isinstance(value, _Nr) else value
    return pc, concrete(a), concrete(x), tuple(concrete(word) for word in memory), frozenset((number,))


def _settled(state: State) -> State:
    """A path down to one number holds it as that number, not NR: the state the per-number walk has."""
    return _with_number(state, next(iter(state[4]))) if len(state[4]) == 1 else state


def _explore(program: list[tuple[int, int, int, int]], data: bytes, what: str, known_bytes: int,
             numbers: frozenset[int] | None) -> dict[int | None, set[int]]:
    """What the program returns, by syscall number (`numbers`: the first 4 bytes of `data` are each of
    them in turn) or under None (`data` as it is)."""
    keys: list[int | None] = list(numbers) if numbers is not None else [None]
    results: dict[int | None, set[int]] = {key: set() for key in keys}
    pending: list[State] = [(0, 0, 0, (0,) * MEMORY_WORDS, numbers or frozenset())]
    seen: set[State] = set()
    steps = 0
    while pending:
        state = pending.pop()
        if state in seen:
            continue
        seen.add(state)
        if len(seen) > MAX_STATES:
            raise ImageError(f"{what}: seccomp program has more than {MAX_STATES} paths to check")
        pc, a, x, memory_words, path_numbers = state
        memory = list(memory_words)

        def returns(value: int) -> None:
            for key in (path_numbers if numbers is not None else keys):
                results[key].add(value)

        def split() -> None:
            """An operation that needs the number itself: the path goes on once per number."""
            pending.extend(_with_number((pc, a, x, tuple(memory), path_numbers), number) for number in path_numbers)
        while True:
            steps += 1
            if steps > MAX_STEPS:
                raise ImageError(f"{what}: seccomp program takes more than {MAX_STEPS} steps to check")
            if pc >= len(program):
                raise ImageError(f"{what}: seccomp program runs past its end")
            code, jt, jf, k = program[pc]
            klass = code & 0x07
            if code == 0x20:                                   # ld [k]
                if k % 4 or k + 4 > SECCOMP_DATA_BYTES:
                    raise ImageError(f"{what}: seccomp program loads seccomp_data at byte {k}")
                if numbers is not None and k == 0:
                    a = NR if len(path_numbers) > 1 else next(iter(path_numbers))
                else:
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
                if isinstance(a, _Nr) or isinstance(operand, _Nr):
                    split()
                    break
                if code == 0x84:
                    a = None if a is None else -a & 0xFFFFFFFF
                elif operation in _ALU:
                    if operation == 0x30 and operand in (0, None):
                        returns(0)  # division by zero ends the program with 0 (kill)
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
                    test = _JUMPS[code & 0xF0]
                    if isinstance(operand, _Nr) or (isinstance(a, _Nr) and operand is None):
                        split()
                        break
                    if isinstance(a, _Nr):                     # the numbers parted by the test
                        if code & 0xF0 == 0x10:                # jeq, a filter's every other step
                            taken = path_numbers & {operand}
                        else:
                            taken = frozenset(n for n in path_numbers if test(n, operand))
                        if taken and taken != path_numbers:
                            pending.append(_settled((pc + 1 + jf, a, x, tuple(memory), path_numbers - taken)))
                            _, a, x, memory_words, path_numbers = _settled((pc, a, x, tuple(memory), taken))
                            memory = list(memory_words)
                        pc += jt if taken else jf
                    elif a is None or operand is None:         # either way: both are followed
                        pending.append((pc + 1 + jf, a, x, tuple(memory), path_numbers))
                        pc += jt
                    else:
                        pc += jt if test(a, operand) else jf
                else:
                    raise ImageError(f"{what}: seccomp program has opcode {code:#x}")
            elif code == 0x06:                                 # ret #k
                returns(k)
                break
            elif code == 0x16:                                 # ret a
                if isinstance(a, _Nr):
                    split()
                    break
                returns(RET_ALLOW if a is None else a)
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
    return nr in allowed_syscalls(programs, {nr}, what, arch)


def allowed_syscalls(programs: list[list[tuple[int, int, int, int]]], numbers: set[int], what: str,
                     arch: int = AUDIT_ARCH_X86_64) -> set[int]:
    """The syscall numbers among `numbers` that may_allow() would say go through the chain."""
    allowed = set(numbers)
    for program in programs:
        if not allowed:
            break
        by_number = outcomes_by_syscall(program, allowed, what, arch)
        allowed = {nr for nr in allowed if any(allows(action & RET_ACTION_FULL) for action in by_number[nr])}
    return allowed
