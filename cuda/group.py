"""A job's containers moved as one on the GPU: every member's CUDA processes locked before any is
checkpointed, and put back on the GPU only together.

Suspend, in order: each member's CUDA processes found (forked children left out) and refused if not
running; all members locked at once (a thread per member, each member's processes in parallel as
cuda/engine.py does) -- the barrier: a rank whose peer is locked waits in its next collective for ever,
so no member may be locked alone (a lock that timed out all the same is tried again once every member
is unlocked); all checkpointed; a suspension record per member that has CUDA
processes (engine "group"), which the shim's checkpoint dumps as it is. Any failure puts every member
back to running, and the error's one line names the member and the cause.
Resume: every member's checkpointed processes restored onto the GPU, then all unlocked; a failed
restore puts every member back to checkpointed (still suspended), a failed unlock runs every one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import GpuCheckpointError, GpuckptError
from ..node.suspension import SuspendedProcess, Suspension, remove_suspension, write_suspension
from ..oci.timestamps import utc_now
from .driver import CudaDriver, GpuPair, LockTimeout, ProcessState
from .engine import CudaSession, one_line, query_states, refuse_stopped, run_parallel
from .forked import split_forked_children
from .hugepages import hugepages_always
from .node import NodeGpus
from .suspend import checkpointed_pids

GROUP_ENGINE = "group"  # the suspension record's engine when a group checkpoint made it
LOCK_ATTEMPTS = 3  # a group lock that timed out (ranks caught mid-collective) is tried again after all unlock
LOCK_RETRY_PAUSE_S = 0.2  # for the ranks to meet in between


@dataclass(frozen=True)
class GroupMember:
    """One container of the group, as its engine names it."""

    name: str
    container_id: str
    init_pid: int


class GroupMemberFailed(GpuCheckpointError):
    """A member failed a phase; `member` names it (the whole group was put back)."""

    def __init__(self, message: str, member: str) -> None:
        super().__init__(message)
        self.member = member


@dataclass
class _Moved:
    member: GroupMember
    session: CudaSession


def _each(moved: Sequence[_Moved], action: Callable[[_Moved], None]) -> tuple[str, BaseException] | None:
    """`action` on every member at once (a thread each); the first failed member (by name) and its error."""
    failures = run_parallel(lambda index: action(moved[index]), range(len(moved)))
    if not failures:
        return None
    index = min(failures, key=lambda failed: moved[failed].member.name)
    return moved[index].member.name, failures[index]


class GroupSuspend:
    """The CUDA side of a group checkpoint: lock all, checkpoint all, or put all back."""

    def __init__(self, members: Sequence[GroupMember], gpus: NodeGpus) -> None:
        self.gpus = gpus
        holding = {member.name: gpus.find_cuda_pids(gpus.descendants(member.init_pid)) for member in members}
        # the driver only where a member holds it: a group of CPU containers needs none (nor a GPU node)
        driver = gpus.load_driver() if any(holding.values()) else None
        self.moved: list[_Moved] = []
        for member in members:
            if driver is not None and holding[member.name]:
                cuda_pids, _ = split_forked_children(driver, holding[member.name])
                if cuda_pids:
                    self.moved.append(_Moved(member, CudaSession(driver, cuda_pids)))
        self.records: list[Suspension] = []

    @property
    def cuda_members(self) -> list[GroupMember]:
        """The members with CUDA processes (the others have nothing on a GPU to move)."""
        return [moved.member for moved in self.moved]

    def _fail(self, phase: str, failed: tuple[str, BaseException]) -> GroupMemberFailed:
        name, error = failed
        leftovers = self.rollback()
        state = f"rollback could not resume {'; '.join(leftovers)}" if leftovers else \
            "every member keeps running as before"
        return GroupMemberFailed(f"member {name}: {phase} failed ({one_line(error)}); {state}", name)

    def suspend(self, lock_timeout_ms: int, *, hugepages: bool = False) -> list[Suspension]:
        """Lock every member, then checkpoint every member; a record per member with CUDA processes."""
        for moved in self.moved:  # refusals before anything is touched: nothing to put back
            try:
                refuse_stopped(moved.session.pids)
                moved.session.require_running()
            except GpuckptError as error:
                raise GroupMemberFailed(f"member {moved.member.name}: refused ({one_line(error)}); nothing was "
                                        "locked, every member keeps running", moved.member.name) from None
        usage = self.gpus.compute_processes() if self.cuda_members else {}
        try:
            with hugepages_always(hugepages):
                self._lock_all(lock_timeout_ms)
                if failed := _each(self.moved, lambda each: each.session.checkpoint()):
                    raise self._fail("device checkpoint", failed)
            for moved in self.moved:
                record = Suspension(
                    container=moved.member.container_id, engine=GROUP_ENGINE, init_pid=moved.member.init_pid,
                    since=utc_now(), suspend_s=sum(moved.session.timings.values()),
                    processes=[SuspendedProcess(pid=pid, gpu_uuids=sorted(usage.get(pid, {})),
                                                device_bytes=sum(usage.get(pid, {}).values()))
                               for pid in moved.session.pids])
                write_suspension(record)  # the shim's checkpoint dumps a suspended container as it is
                self.records.append(record)
        except GroupMemberFailed:
            raise
        except BaseException as error:  # noqa: BLE001 -- a rollback boundary (^C too): every member back
            leftovers = self.rollback()
            state = f"rollback could not resume {'; '.join(leftovers)}" if leftovers else \
                "every member keeps running as before"
            raise GpuCheckpointError(f"group suspend failed ({one_line(error)}); {state}") from None
        return self.records

    def _lock_all(self, lock_timeout_ms: int) -> None:
        """Every member locked at once. A rank whose collective waits on a peer locked before it submitted its
        part never reaches a lockable point: its lock times out. Then every member is unlocked, the ranks meet,
        and the lock is tried again, LOCK_ATTEMPTS times in all."""
        for attempt in range(1, LOCK_ATTEMPTS + 1):
            failed = _each(self.moved, lambda each: each.session.lock(lock_timeout_ms))
            if failed is None:
                return
            timed_out = all(isinstance(error, LockTimeout) for each in self.moved
                            for error in each.session.last_failures.values())
            if attempt == LOCK_ATTEMPTS or not timed_out:
                raise self._fail("CUDA lock" + (f" ({attempt} attempts)" if attempt > 1 else ""), failed)
            if leftovers := [line for each in self.moved for line in each.session.rollback()]:
                raise GroupMemberFailed(f"member {failed[0]}: CUDA lock timed out; rollback could not resume "
                                        f"{'; '.join(leftovers)}", failed[0])
            time.sleep(LOCK_RETRY_PAUSE_S)

    def rollback(self) -> list[str]:
        """Every member's processes back to running, their records removed; what could not be, one line each."""
        for record in self.records:
            remove_suspension(record.container)
        self.records = []
        lines: list[str] = []
        results: dict[int, list[str]] = {}

        def undo(index: int) -> None:
            results[index] = self.moved[index].session.rollback()
        failures = run_parallel(undo, range(len(self.moved)))
        for index, moved in enumerate(self.moved):
            if index in failures:
                lines.append(f"member {moved.member.name}: {one_line(failures[index])}")
            lines.extend(f"member {moved.member.name}: {line}" for line in results.get(index, []))
        return lines


def resume_group(members: Sequence[GroupMember], gpus: NodeGpus, *,
                 pairs: Mapping[str, Sequence[GpuPair]] | None = None, hugepages: bool = False) -> list[str]:
    """Every member's checkpointed CUDA processes back onto the GPU (`pairs` by container ID: a standby
    restore's choice), then all unlocked; the names of the members that had any. `members`: those whose GPU
    state is in host memory (a suspension record says so); their processes are asked of the driver, as
    cuda/suspend.resume does (a checkpointed process may hold no /dev/nvidia* file). A failed restore leaves
    every member checkpointed; a failed unlock, every member running that could be."""
    if not members:
        return []
    pairs = pairs or {}
    driver = gpus.load_driver()
    moved = [_Moved(member, CudaSession(driver, checkpointed_pids(driver, gpus.descendants(member.init_pid))))
             for member in members]
    moved = [each for each in moved if each.session.pids]
    with hugepages_always(hugepages):
        failed = _each(moved, lambda each: each.session.restore(pairs.get(each.member.container_id, ())))
    if failed:
        _back_to_checkpointed(driver, moved)
        name, error = failed
        raise GroupMemberFailed(f"member {name}: device restore failed ({one_line(error)}); every member's GPU "
                                "state stays in host memory", name)
    if failed := _each(moved, lambda each: each.session.unlock()):
        leftovers = [line for each in moved for line in each.session.rollback()]
        name, error = failed
        state = f"; could not resume {'; '.join(leftovers)}" if leftovers else "; every member runs"
        raise GroupMemberFailed(f"member {name}: unlock failed ({one_line(error)}){state}", name)
    return [each.member.name for each in moved]


def _back_to_checkpointed(driver: CudaDriver, moved: Sequence[_Moved]) -> None:
    """After a failed group restore: whatever came back goes back to host memory (as cuda/suspend.resume)."""
    pids = [pid for each in moved for pid in each.session.pids]
    answers = query_states(driver, pids)
    back = CudaSession(driver, [pid for pid in pids if answers[pid] == ProcessState.LOCKED])
    with contextlib.suppress(GpuckptError):
        back.checkpoint()
