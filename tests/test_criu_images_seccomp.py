"""Seccomp programs from CRIU images run as the kernel runs them, and compared with the spec's rules."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from criu_image_builder import REAL_DUMP, ImageBuilder, spec
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuckpt.errors import ImageError
from gpuckpt.oci.criu_images import directory_source, mapping_source, read_checkpoint_images
from gpuckpt.policy.image import GUARDED_SYSCALLS, refusals
from gpuckpt.policy.seccomp_bpf import (
    NR_AND_ARCH_BYTES,
    RET_ALLOW,
    RET_LOG,
    allowed_syscalls,
    decode,
    may_allow,
    outcomes,
    outcomes_by_syscall,
    seccomp_data,
)

ALL_CAPS_FILTER = Path(__file__).parent / "data" / "criu-podman-allcaps-seccomp.img"  # --cap-add=ALL's, runc
ERRNO, KILL_PROCESS = 0x00050000, 0x80000000
READ, OPEN_BY_HANDLE_AT, BPF = 0, 304, 321


def insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def ret(action: int) -> bytes:
    return insn(0x06, action)


def real_filter(seccomp_img: Path = REAL_DUMP / "seccomp.img") -> list:
    """The decoded programs of a seccomp.img, read with the real dump's other images."""
    files = {path.name: path.read_bytes() for path in REAL_DUMP.glob("*.img")}
    images = read_checkpoint_images(mapping_source({**files, "seccomp.img": seccomp_img.read_bytes()}), "real")
    return [decode(program, "real") for program in images.seccomp_programs]


def test_podmans_default_filter_allows_read_and_denies_file_handles() -> None:
    programs = real_filter()
    assert may_allow(programs, READ, "real")
    assert not may_allow(programs, OPEN_BY_HANDLE_AT, "real")
    assert not may_allow(programs, BPF, "real")


def test_the_all_capabilities_filter_allows_what_the_default_denies() -> None:
    programs = real_filter(ALL_CAPS_FILTER)
    assert may_allow(programs, OPEN_BY_HANDLE_AT, "real")
    assert may_allow(programs, BPF, "real")


@pytest.mark.parametrize("seccomp_img", [REAL_DUMP / "seccomp.img", ALL_CAPS_FILTER])
def test_real_filters_judge_every_guarded_syscall_alike_one_by_one_or_all_at_once(seccomp_img: Path) -> None:
    programs = real_filter(seccomp_img)
    numbers = {*GUARDED_SYSCALLS.values(), READ}
    one_by_one = {nr for nr in numbers if all(
        any(action & 0xFFFF0000 in (RET_ALLOW, RET_LOG, 0x7FF00000, 0x7FC00000)
            for action in outcomes(program, seccomp_data(nr), "real", NR_AND_ARCH_BYTES)) for program in programs)}
    assert allowed_syscalls(programs, numbers, "real") == one_by_one
    assert READ in one_by_one


def test_one_filter_of_a_chain_that_denies_denies() -> None:
    """The kernel keeps the action of highest precedence: an allow elsewhere in the chain does not undo a deny."""
    allow, log, errno, kill = (decode(ret(action), "p") for action in (RET_ALLOW, RET_LOG, ERRNO | 1, KILL_PROCESS))
    assert not may_allow([allow, errno], READ, "c")
    assert not may_allow([errno, kill, allow], READ, "c")
    assert may_allow([allow], READ, "c")
    assert may_allow([allow, log], READ, "c")


def test_arithmetic_jumps_and_scratch_memory() -> None:
    program = decode(b"".join([
        insn(0x20, 0),            # A = nr
        insn(0x04, 5),            # A += 5
        insn(0x02, 3),            # M[3] = A
        insn(0x01, 0),            # X = 0
        insn(0x61, 3),            # X = M[3]
        insn(0x87),               # A = X
        insn(0x15, 9, 0, 1),      # A == 9 ? next : skip one
        ret(RET_ALLOW),
        ret(ERRNO),
    ]), "p")
    assert outcomes(program, seccomp_data(4), "p") == {RET_ALLOW}
    assert outcomes(program, seccomp_data(5), "p") == {ERRNO}
    divide_by_x = decode(insn(0x01, 0) + insn(0x3C) + ret(RET_ALLOW), "p")
    assert outcomes(divide_by_x, seccomp_data(0), "p") == {0}  # the kernel ends it with 0: kill


@pytest.mark.hostile("seccomp programs the kernel refuses (bad opcode, loads outside seccomp_data, jumps past the end)")
@pytest.mark.parametrize("program, message", [
    (insn(0xFF), "opcode 0xff"),
    (insn(0x20, 64) + ret(0), "loads seccomp_data at byte 64"),
    (insn(0x20, 2) + ret(0), "loads seccomp_data at byte 2"),
    (insn(0x05, 7) + ret(0), "runs past its end"),
    (insn(0x00, 1), "runs past its end"),
    (insn(0x60, 16) + ret(0), "scratch word 16"),
    (b"", "1 to 4096"),
    (ret(0) * 4097, "1 to 4096"),
    (b"\x06" * 7, "1 to 4096"),
])
def test_programs_the_kernel_would_refuse_are_one_line(program: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        outcomes(decode(program, "p"), seccomp_data(0), "p")


@pytest.mark.hostile("seccomp.img whose filter is replaced by one allowing every syscall")
def test_a_filter_allowing_what_the_spec_denies_is_refused(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    build.write("seccomp.img", "SECCOMP", build.pb.seccomp(seccomp_filters=[build.filter(ret(RET_ALLOW))]))
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert refusals(held, spec()) == ["process 1 (sleep): its seccomp filters allow _sysctl, acct, add_key, bpf "
                                      "(+24 more), which the spec's linux.seccomp denies"]
    assert refusals(held, spec(linux_seccomp=None)) == []  # no rules in the spec: nothing to compare


def test_a_process_adding_its_own_filter_on_top_passes(tmp_path: Path) -> None:
    """A filter the program installed itself (allow-all, chained on the runtime's) changes nothing."""
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    real = (REAL_DUMP / "seccomp.img").read_bytes()
    entry = build.pb.seccomp()
    entry.ParseFromString(real[12:])
    entry.seccomp_filters.append(build.filter(ret(RET_ALLOW), prev=0))
    build.write("seccomp.img", "SECCOMP", entry)
    build.write("core-1.img", "CORE", build.core(None, 2, 1))
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert held.tasks[0].threads[0].seccomp_chain == (1, 0)
    assert refusals(held, spec()) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x0C, 0x15, 0x16, 0x1D,
                                           0x20, 0x25, 0x35, 0x3C, 0x45, 0x60, 0x61, 0x80, 0x81, 0x84, 0x87, 0x94,
                                           0xFF]),
                          st.integers(0, 3), st.integers(0, 3), st.integers(0, 70)), min_size=1, max_size=40),
       st.integers(-(2**31), 2**31 - 1))
@pytest.mark.hostile("fuzzed seccomp programs")
def test_fuzzed_programs_return_a_value_or_one_line(instructions, nr: int) -> None:
    program = b"".join(insn(code, k, jt, jf) for code, jt, jf, k in instructions)
    try:
        (result,) = outcomes(decode(program, "fuzz"), seccomp_data(nr), "fuzz")  # all of the data known: one
        assert 0 <= result < 2**32
    except ImageError as error:
        assert "\n" not in str(error) and str(error).startswith("fuzz: ")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x0C, 0x15, 0x16, 0x1D,
                                           0x20, 0x25, 0x35, 0x3C, 0x45, 0x60, 0x61, 0x80, 0x81, 0x84, 0x87, 0x94,
                                           0x1C, 0x2C, 0x54]),
                          st.integers(0, 3), st.integers(0, 3), st.integers(0, 70)), min_size=1, max_size=40),
       st.sets(st.integers(0, 70), min_size=1, max_size=6))
def test_many_syscalls_explored_at_once_return_what_each_returns_alone(instructions, numbers: set[int]) -> None:
    """The shared exploration parts the numbers only where the program does (the operands reach the numbers)."""
    program = b"".join(insn(code, k, jt, jf) for code, jt, jf, k in instructions)
    alone: dict[int, set[int] | None] = {}
    for nr in numbers:
        try:
            alone[nr] = outcomes(decode(program, "fuzz"), seccomp_data(nr), "fuzz", NR_AND_ARCH_BYTES)
        except ImageError:
            alone[nr] = None
    try:
        together: dict[int, set[int]] | None = outcomes_by_syscall(decode(program, "fuzz"), numbers, "fuzz")
    except ImageError:
        together = None
    if None in alone.values():
        assert together is None  # a program the kernel would refuse is refused, whichever number meets it
    else:
        assert together == alone


@pytest.mark.hostile("a seccomp filter that allows a guarded syscall only when the instruction pointer is not 0")
def test_a_filter_allowing_by_instruction_pointer_or_argument_is_refused(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    # ld [8] (instruction pointer, low word); jeq #0 -> errno, else allow
    program = insn(0x20, 8) + insn(0x15, 0, jt=0, jf=1) + ret(ERRNO) + ret(RET_ALLOW)
    build.write("seccomp.img", "SECCOMP", build.pb.seccomp(seccomp_filters=[build.filter(program)]))
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert "which the spec's linux.seccomp denies" in refusals(held, spec())[0]


@pytest.mark.hostile("a seccomp filter that hands the guarded syscalls to a tracer (RET_TRACE)")
def test_a_filter_tracing_what_the_spec_denies_is_refused(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    build.write("seccomp.img", "SECCOMP", build.pb.seccomp(seccomp_filters=[build.filter(ret(0x7FF00000))]))
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert "which the spec's linux.seccomp denies" in refusals(held, spec())[0]


def test_an_argument_test_denying_either_way_is_not_taken_for_allowing() -> None:
    """Both branches of a jump on an argument are followed; when both deny, the syscall is denied."""
    program = decode(insn(0x20, 16) + insn(0x15, 1, jt=0, jf=1) + ret(ERRNO) + ret(KILL_PROCESS), "t")
    assert not may_allow([program], BPF, "t")
    assert may_allow([decode(insn(0x20, 16) + insn(0x15, 1, jt=0, jf=1) + ret(ERRNO) + ret(RET_ALLOW), "t")],
                     BPF, "t")


AUDIT_ARCH_X86_64, AUDIT_ARCH_I386 = 0xC000003E, 0x40000003


def deny_guarded_on_x86_64_only() -> bytes:
    """ld arch; not x86_64 -> allow; ld nr; jeq each guarded syscall -> errno; else allow."""
    numbers = sorted(set(GUARDED_SYSCALLS.values()))
    program = insn(0x20, 4) + insn(0x15, AUDIT_ARCH_X86_64, jt=0, jf=len(numbers) + 3) + insn(0x20, 0)
    for left, nr in enumerate(numbers):
        program += insn(0x15, nr, jt=len(numbers) - left, jf=0)
    return program + ret(RET_ALLOW) + ret(ERRNO | 1) + ret(RET_ALLOW)


@pytest.mark.hostile("a seccomp filter that denies the guarded syscalls for x86_64 and allows every other arch")
def test_a_filter_leaving_the_i386_entry_open_is_refused(tmp_path: Path) -> None:
    program = deny_guarded_on_x86_64_only()
    assert allowed_syscalls([decode(program, "p")], set(GUARDED_SYSCALLS.values()), "p") == set()
    assert allowed_syscalls([decode(program, "p")], {21}, "p", AUDIT_ARCH_I386) == {21}  # i386 mount goes through
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    build.write("seccomp.img", "SECCOMP", build.pb.seccomp(seccomp_filters=[build.filter(program)]))
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert any("which the spec's linux.seccomp denies" in line for line in refusals(held, spec()))


def test_a_number_held_as_nr_or_as_itself_is_one_state() -> None:
    """ld nr; st M[15]; jeq #1 (parts 1 from 2); then 16 times: an argument decides whether M[i] gets M[15] (NR)
    or ld [0] (the number itself): one state per number alone, 2^16 in the shared walk."""
    program = insn(0x20, 0) + insn(0x02, 15) + insn(0x15, 1)
    for word in range(16):
        program += (insn(0x20, 16) + insn(0x15, 0, jt=0, jf=2) + insn(0x60, 15) + insn(0x05, 1) + insn(0x20, 0)
                    + insn(0x02, word))
    program += ret(RET_ALLOW)
    decoded = decode(program, "p")
    alone = {nr: outcomes(decoded, seccomp_data(nr), "p", NR_AND_ARCH_BYTES) for nr in (1, 2)}
    assert alone == {1: {RET_ALLOW}, 2: {RET_ALLOW}}
    assert outcomes_by_syscall(decoded, {1, 2}, "p") == alone


@pytest.mark.hostile("a seccomp filter whose check runs thousands of paths through a long tail (a restore's CPU)")
def test_a_filter_that_costs_far_more_to_check_than_real_ones_is_refused() -> None:
    """10 argument tests, each storing a different value (1,024 paths), then 4,000 instructions for each path:
    4 million steps, where podman's filter takes ~750 for all the guarded syscalls."""
    program = b"".join(insn(0x20, 16) + insn(0x15, 0, jt=0, jf=1) + insn(0x00, 1) + insn(0x02, word)
                       for word in range(10))
    program += insn(0x00, 7) * (4095 - 40) + ret(RET_ALLOW)
    with pytest.raises(ImageError, match="to check"):
        allowed_syscalls([decode(program, "p")], set(GUARDED_SYSCALLS.values()), "p")
