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
from collections.abc import Callable

from ..errors import ImageError

AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_DATA_BYTES = 64
MAX_INSNS = 4096                 # BPF_MAXINSNS
RET_ACTION_FULL = 0xFFFF0000
RET_ALLOW, RET_LOG, RET_TRACE, RET_USER_NOTIF = 0x7FFF0000, 0x7FFC0000, 0x7FF00000, 0x7FC00000
NR_AND_ARCH_BYTES = 8            # what a syscall number fixes in seccomp_data; the rest may be anything
MEMORY_WORDS = 16                # BPF_MEMWORDS

_ALU: dict[int, Callable[[int, int], int | None]] = {
    0x00: lambda a, b: a + b, 0x10: lambda a, b: a - b, 0x20: lambda a, b: a * b,
    0x30: lambda a, b: a // b if b else None, 0x40: lambda a, b: a | b, 0x50: lambda a, b: a & b,
    0x60: lambda a, b: a << (b & 31), 0x70: lambda a, b: a >> (b & 31), 0xA0: lambda a, b: a ^ b}
_JUMPS: dict[int, Callable[[int, int], bool]] = {
    0x10: lambda a, b: a == b, 0x20: lambda a, b: a > b, 0x30: lambda a, b: a >= b, 0x40: lambda a, b: bool(a & b)}


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
    return _Exploration(program, data, what, known_bytes, numbers).run()


class _Path:
    """One path being walked: its registers, scratch memory and the syscall numbers it stands for. Each
    walk holds its own, so what an instruction reads is this path's, as the kernel's one run would."""

    __slots__ = ("a", "memory", "numbers", "pc", "x")

    def __init__(self, state: State) -> None:
        self.pc, self.a, self.x, memory_words, self.numbers = state
        self.memory = list(memory_words)

    def state(self) -> State:
        return self.pc, self.a, self.x, tuple(self.memory), self.numbers


class _Exploration:
    """The paths of one program still to walk and what the walked ones returned; one method per kind of
    instruction, each saying whether the path ends there."""

    def __init__(self, program: list[tuple[int, int, int, int]], data: bytes, what: str, known_bytes: int,
                 numbers: frozenset[int] | None) -> None:
        self.program, self.data, self.what, self.known_bytes, self.numbers = program, data, what, known_bytes, numbers
        self.keys: list[int | None] = list(numbers) if numbers is not None else [None]
        self.results: dict[int | None, set[int]] = {key: set() for key in self.keys}
        self.pending: list[State] = [(0, 0, 0, (0,) * MEMORY_WORDS, numbers or frozenset())]
        self.steps = 0

    def run(self) -> dict[int | None, set[int]]:
        seen: set[State] = set()
        while self.pending:
            state = self.pending.pop()
            if state in seen:
                continue
            seen.add(state)
            if len(seen) > MAX_STATES:
                raise ImageError(f"{self.what}: seccomp program has more than {MAX_STATES} paths to check")
            self._walk(_Path(state))
        return self.results

    def _walk(self, path: _Path) -> None:
        while True:
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise ImageError(f"{self.what}: seccomp program takes more than {MAX_STEPS} steps to check")
            if path.pc >= len(self.program):
                raise ImageError(f"{self.what}: seccomp program runs past its end")
            if self._step(path, self.program[path.pc]):
                return
            path.pc += 1

    def _step(self, path: _Path, instruction: tuple[int, int, int, int]) -> bool:
        """Runs one instruction on `path`; True where the path ends there (returned, or split by number)."""
        code, _, _, k = instruction
        klass = code & 0x07
        if klass == 0x04:
            return self._alu(path, code, k)
        if klass == 0x05:
            return self._jump(path, instruction)
        if code in (0x06, 0x16):                           # ret #k, ret a
            return self._ret(path, code, k)
        if code in (0x20, 0x80, 0x81, 0x00, 0x01):          # ld [k], ld len, ldx len, ld #k, ldx #k
            self._load(path, code, k)
        elif code in (0x60, 0x61, 0x02, 0x03):             # ld M[k], ldx M[k], st M[k], stx M[k]
            self._scratch(path, code, k)
        elif code == 0x07:                                 # tax
            path.x = path.a
        elif code == 0x87:                                 # txa
            path.a = path.x
        else:
            raise ImageError(f"{self.what}: seccomp program has opcode {code:#x}")
        return False

    def _returns(self, path: _Path, value: int) -> None:
        for key in (path.numbers if self.numbers is not None else self.keys):
            self.results[key].add(value)

    def _split(self, path: _Path) -> bool:
        """An operation that needs the number itself: the path goes on once per number (and ends here)."""
        state = path.state()
        self.pending.extend(_with_number(state, number) for number in path.numbers)
        return True

    def _load(self, path: _Path, code: int, k: int) -> None:
        if code == 0x20:                                   # ld [k]
            if k % 4 or k + 4 > SECCOMP_DATA_BYTES:
                raise ImageError(f"{self.what}: seccomp program loads seccomp_data at byte {k}")
            if self.numbers is not None and k == 0:
                path.a = NR if len(path.numbers) > 1 else next(iter(path.numbers))
            else:
                path.a = struct.unpack_from("<I", self.data, k)[0] if k + 4 <= self.known_bytes else None
        elif code == 0x80:                                 # ld len
            path.a = SECCOMP_DATA_BYTES
        elif code == 0x81:                                 # ldx len
            path.x = SECCOMP_DATA_BYTES
        elif code == 0x00:                                 # ld #k
            path.a = k
        else:                                              # ldx #k
            path.x = k

    def _scratch(self, path: _Path, code: int, k: int) -> None:
        if k >= MEMORY_WORDS:
            raise ImageError(f"{self.what}: seccomp program uses scratch word {k}")
        if code == 0x60:
            path.a = path.memory[k]
        elif code == 0x61:
            path.x = path.memory[k]
        else:
            path.memory[k] = path.a if code == 0x02 else path.x

    def _alu(self, path: _Path, code: int, k: int) -> bool:
        operation = code & 0xF0
        operand = path.x if code & 0x08 else k
        a = path.a
        if isinstance(a, _Nr) or isinstance(operand, _Nr):
            return self._split(path)
        if code == 0x84:                                   # neg
            path.a = None if a is None else -a & 0xFFFFFFFF
            return False
        if operation not in _ALU:
            raise ImageError(f"{self.what}: seccomp program has opcode {code:#x}")
        if operation == 0x30 and operand in (0, None):
            self._returns(path, 0)  # division by zero ends the program with 0 (kill)
            if operand == 0:
                return True
        result = None if a is None or operand is None else _ALU[operation](a, operand)
        path.a = None if result is None else result & 0xFFFFFFFF
        return False

    def _jump(self, path: _Path, instruction: tuple[int, int, int, int]) -> bool:
        code, jt, jf, k = instruction
        if code == 0x05:                                   # ja
            path.pc += k
            return False
        if code & 0xF0 not in _JUMPS:
            raise ImageError(f"{self.what}: seccomp program has opcode {code:#x}")
        operand = path.x if code & 0x08 else k
        a = path.a
        if isinstance(operand, _Nr):
            return self._split(path)
        if isinstance(a, _Nr):                             # the numbers parted by the test
            if operand is None:
                return self._split(path)
            self._part(path, code, operand, jt, jf)
        elif a is None or operand is None:                 # either way: both are followed
            self.pending.append((path.pc + 1 + jf, a, path.x, tuple(path.memory), path.numbers))
            path.pc += jt
        else:
            path.pc += jt if _JUMPS[code & 0xF0](a, operand) else jf
        return False

    def _part(self, path: _Path, code: int, operand: int, jt: int, jf: int) -> None:
        """A jump on the number NR stands for: the numbers that take it go on along this path, the others
        wait at the other branch."""
        if code & 0xF0 == 0x10:                            # jeq, a filter's every other step
            taken = path.numbers & {operand}
        else:
            test = _JUMPS[code & 0xF0]
            taken = frozenset(n for n in path.numbers if test(n, operand))
        if taken and taken != path.numbers:
            pc, a, x, memory_words, numbers = path.state()
            self.pending.append(_settled((pc + 1 + jf, a, x, memory_words, numbers - taken)))
            _, path.a, path.x, memory_words, path.numbers = _settled((pc, a, x, memory_words, taken))
            path.memory = list(memory_words)
        path.pc += jt if taken else jf

    def _ret(self, path: _Path, code: int, k: int) -> bool:
        if code == 0x06:                                   # ret #k
            self._returns(path, k)
        elif isinstance(path.a, _Nr):                      # ret a
            return self._split(path)
        else:
            self._returns(path, RET_ALLOW if path.a is None else path.a)
        return True


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
