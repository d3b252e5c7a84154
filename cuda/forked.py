"""Forked children of CUDA processes: found, and let go of the device before the dump.

A process forked after CUDA was initialised (PyTorch's DataLoader and compile workers)
inherits its parent's /dev/nvidia* descriptors and mappings, yet the driver does not know
it (cuCheckpointProcessGetState: CUDA_ERROR_NOT_INITIALIZED on driver 580) and CUDA may
never be used in it. CRIU cannot dump those descriptors or mappings, and driver 580 has no
way to checkpoint them (590's "launch job" is meant for this). What the shim does instead is
what the kernel does when such a child exits, which workers do all the time: it closes the
child's /dev/nvidia* descriptors and unmaps its /dev/nvidia* mappings, by system calls run
inside the child (`gpuckpt.host.ptrace`). The child's own memory and every other file stay as
they are, the parent's device state is untouched, and CRIU then dumps the child like any
process. Done before the lock, so a failure leaves every process running.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from ..errors import DriverError, GpuCheckpointError
from ..host.procfs import start_time
from ..host.ptrace import SYS_CLOSE, SYS_MUNMAP, RemoteCallError, remote_syscalls
from ..oci.nvidia_paths import NVIDIA_DEVICE_PREFIX
from .driver import CudaDriver
from .engine import query_states, refuse_stopped

CUDA_ERROR_NOT_INITIALIZED = "CUDA_ERROR_NOT_INITIALIZED"
SPAWN_HINT = ("start the workers with the 'spawn' method instead (DataLoader(..., multiprocessing_context='spawn'))")


@dataclass(frozen=True)
class DeviceHold:
    """What one forked child holds of the NVIDIA driver."""

    pid: int
    started: int | None  # its start time: with the PID, the process (None: it had ended)
    fds: tuple[int, ...]
    mappings: tuple[tuple[int, int], ...]  # (start, length)


def split_forked_children(driver: CudaDriver, holding_pids: list[int]) -> tuple[list[int], list[int]]:
    """(CUDA processes, forked children) among the processes that hold /dev/nvidia*: a child is
    one the driver answers CUDA_ERROR_NOT_INITIALIZED for."""
    cuda_pids, children = [], []
    answers = query_states(driver, holding_pids)  # watched: GetState waits while a process is stopped
    for pid in holding_pids:
        answer = answers[pid]
        if isinstance(answer, DriverError) and answer.cuda_error == CUDA_ERROR_NOT_INITIALIZED:
            children.append(pid)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            cuda_pids.append(pid)
    return cuda_pids, children


def device_hold(pid: int, prefix: str = NVIDIA_DEVICE_PREFIX) -> DeviceHold:
    """The descriptors and mappings of `pid` whose path starts with `prefix` (the driver's device
    nodes), from /proc."""
    fds: list[int] = []
    mappings: list[tuple[int, int]] = []
    started = start_time(pid)  # before what it holds: a PID taken again later does not match it
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
        with open(f"/proc/{pid}/maps") as maps:
            lines = maps.readlines()
    except FileNotFoundError:
        started = None
    if started is None:
        return DeviceHold(pid, None, (), ())  # it ended: it holds nothing any more
    for entry in entries:
        try:
            if os.readlink(f"/proc/{pid}/fd/{entry}").startswith(prefix):
                fds.append(int(entry))
        except OSError:
            continue
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(prefix):
            start, end = (int(part, 16) for part in fields[0].split("-"))
            mappings.append((start, end - start))
    return DeviceHold(pid, started, tuple(sorted(fds)), tuple(mappings))


def release_device(hold: DeviceHold) -> None:
    """Close and unmap what `hold` names, inside its process; any failure is one line."""
    calls = [(SYS_CLOSE, fd) for fd in hold.fds] + [(SYS_MUNMAP, start, length) for start, length in hold.mappings]
    if hold.started is None or not calls:
        return  # it ended, or holds nothing
    try:
        results = remote_syscalls(hold.pid, hold.started, calls)
    except (RemoteCallError, OSError) as error:
        raise GpuCheckpointError(f"forked child {hold.pid} of a CUDA process holds the GPU driver and could not "
                                 f"be made to let go of it ({error}); {SPAWN_HINT}") from None
    closed_meanwhile = (SYS_CLOSE, -errno.EBADF)  # the child closed that descriptor itself
    failed = [f"{'close' if call[0] == SYS_CLOSE else 'munmap'}: {os.strerror(-result)}"
              for call, result in zip(calls, results, strict=True)  # one result a call
              if result < 0 and (call[0], result) != closed_meanwhile]
    if failed:
        raise GpuCheckpointError(f"forked child {hold.pid} of a CUDA process could not let go of the GPU driver "
                                 f"({'; '.join(failed)}); {SPAWN_HINT}")


def release_forked_children(children: list[int], prefix: str = NVIDIA_DEVICE_PREFIX) -> list[DeviceHold]:
    """Make every forked child let go of the driver; what each held. Refused, before any change,
    for a child that is stopped (ptrace would run it; SIGCONT it, or it is being debugged)."""
    refuse_stopped(children, "forked child(ren) {pids} of a CUDA process")
    holds = [device_hold(pid, prefix) for pid in children]
    for hold in holds:
        release_device(hold)
    leftover = [pid for pid in children if (still := device_hold(pid, prefix)).fds or still.mappings]
    if leftover:
        raise GpuCheckpointError(f"forked child(ren) {', '.join(map(str, leftover))} of a CUDA process still "
                                 f"hold the GPU driver after it was released; {SPAWN_HINT}")
    return holds
