"""Suspend a container's CUDA processes to host memory and resume them, without CRIU.

Suspend: lock and checkpoint every CUDA process in parallel, then write the suspension
record (node/suspension.py); the GPU is released and the processes stay where they are.
Standby: a restore (shim/restore.py) left its processes as the checkpoint had them, their
GPU state in host memory; only the record is written, naming the GPUs a resume will take.
Resume: check the GPUs have the memory back, restore (optionally onto other GPUs) and
unlock. Any failure leaves the container either running or cleanly suspended (with its
record), never half of each.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from ..errors import DriverError, GpuCheckpointError, GpuckptError
from ..host.procfs import container_pid, resident_bytes
from ..node.suspension import SuspendedProcess, Suspension, write_suspension
from ..oci.manifest import Manifest
from ..oci.timestamps import utc_now
from .compat import memory_needed
from .driver import CudaDriver, GpuPair, ProcessState
from .engine import CudaSession, one_line, query_states, refuse_stopped
from .forked import split_forked_children
from .hugepages import hugepages_always
from .node import NodeGpus


def checkpointed_pids(driver: CudaDriver, pids: Sequence[int]) -> list[int]:
    """The processes the driver holds checkpointed (they no longer show up as GPU users)."""
    found = []
    answers = query_states(driver, pids)  # watched: GetState waits while a process is stopped
    for pid in pids:
        answer = answers[pid]
        if isinstance(answer, BaseException) and not isinstance(answer, DriverError):
            raise answer
        if answer == ProcessState.CHECKPOINTED:  # a DriverError: not a CUDA process
            found.append(pid)
    return found


def suspend(driver: CudaDriver, container: str, engine: str, init_pid: int, lock_timeout_ms: int, *,
            gpus: NodeGpus, hugepages: bool = False) -> Suspension:
    """`hugepages`: THP `always` while the device memory moves (cuda.host_hugepages, cuda/hugepages.py)."""
    # forked children (DataLoader workers) hold the driver but have no CUDA state to move
    cuda_pids, _ = split_forked_children(driver, gpus.find_cuda_pids(gpus.descendants(init_pid)))
    if not cuda_pids:
        raise GpuCheckpointError(f"container {container} has no CUDA process to suspend")
    refuse_stopped(cuda_pids)
    usage = gpus.compute_processes()
    session = CudaSession(driver, cuda_pids)
    session.require_running()
    started = time.monotonic()
    try:
        with hugepages_always(hugepages):
            session.lock(lock_timeout_ms)
            session.checkpoint()
        record = Suspension(
            container=container, engine=engine, init_pid=init_pid,
            since=utc_now(),
            processes=[SuspendedProcess(pid=pid, gpu_uuids=sorted(usage.get(pid, {})),
                                        device_bytes=sum(usage.get(pid, {}).values())) for pid in cuda_pids],
            suspend_s=time.monotonic() - started)
        write_suspension(record)  # resume starts from it: without one, nothing may stay suspended
    except BaseException as error:  # noqa: BLE001 -- a rollback boundary: whatever it was (^C too), the journal says what to undo
        leftovers = session.rollback()
        state = f"rollback could not resume {'; '.join(leftovers)}" if leftovers else "the container keeps running"
        raise GpuCheckpointError(f"suspend of {container} failed ({one_line(error)}); {state}") from None
    return record


STANDBY_ENGINE = "standby"  # the suspension record's engine when a standby restore made it


def standby(container: str, init_pid: int, cuda_pids: Sequence[int], manifest: Manifest,
            pairs: Sequence[GpuPair]) -> Suspension:
    """Record restored processes left checkpointed (a standby): each one's checkpoint GPUs and device bytes
    from the manifest, the GPUs a resume gives them (`pairs`, checked by the restore's node check), and the
    host memory they hold. Nothing of the driver is called: they hold no GPU until resumed."""
    checkpointed = {record.container_pid: record for record in manifest.processes}
    processes = []
    for pid in cuda_pids:
        record = checkpointed.get(container_pid(pid))
        processes.append(SuspendedProcess(pid=pid, gpu_uuids=list(record.gpu_uuids) if record else [],
                                          device_bytes=record.checkpointed_bytes if record else 0))
    entry = Suspension(container=container, engine=STANDBY_ENGINE, init_pid=init_pid, since=utc_now(),
                       processes=processes, gpu_pairs=[(pair.old_uuid, pair.new_uuid) for pair in pairs],
                       host_bytes=resident_bytes(cuda_pids))
    write_suspension(entry)
    return entry


def recorded_pairs(record: Suspension) -> list[GpuPair]:
    """The GPUs a standby restore chose for its resume (none for a suspension: the GPUs it left)."""
    return [GpuPair(old, new) for old, new in record.gpu_pairs]


def _check_memory(record: Suspension, pairs: Sequence[GpuPair], gpus: NodeGpus) -> None:
    """Refuse (and stay suspended) when the GPUs no longer have the memory the processes need."""
    moved = {pair.old_uuid: pair.new_uuid for pair in pairs}
    needed = memory_needed(((p.gpu_uuids, p.device_bytes) for p in record.processes), moved)
    free = {gpu.uuid: gpu.memory_free_bytes for gpu in gpus.list_gpus()}
    short = [f"{uuid} has {free.get(uuid, 0) >> 20} MiB free, needs {want >> 20} MiB"
             for uuid, want in needed.items() if want > free.get(uuid, 0)]
    if short:
        raise GpuCheckpointError(f"resume of {record.container} refused, it stays suspended: " + "; ".join(short))


def resume(driver: CudaDriver, record: Suspension, pairs: Sequence[GpuPair] = (), *, gpus: NodeGpus,
           hugepages: bool = False) -> float:
    """Bring the suspended processes back; the seconds it took. `hugepages` as for suspend."""
    _check_memory(record, pairs, gpus)
    pids = checkpointed_pids(driver, gpus.descendants(record.init_pid))
    if not pids:
        raise GpuCheckpointError(f"container {record.container} has no suspended CUDA process")
    session = CudaSession(driver, pids)
    started = time.monotonic()
    try:
        with hugepages_always(hugepages):
            session.restore(pairs)
    except GpuckptError as error:
        # Cleanly suspended again: whatever came back goes back to host memory.
        answers = query_states(driver, pids)
        back = [pid for pid in pids if answers[pid] == ProcessState.LOCKED]
        again = CudaSession(driver, back)
        with contextlib.suppress(GpuckptError):
            again.checkpoint()
        raise GpuCheckpointError(f"resume of {record.container} failed ({error}); it stays suspended") from None
    session.unlock()
    return time.monotonic() - started
