"""Finishing what a killed gpuckpt-runtime left: its journal (node/journal.py) says what it did.

Called with the container's lock held, by the next owned verb on the container, by
`gpuckpt recover` and by gpuckptd at start. In order: wait for a delegate the killed shim
left running (its dump or restore goes on without it); mark an image complete if CRIU's
log says its dump finished after the journal's dump began (and sign it); bring every
CUDA process the journal names that is still that process back to running (restored to
the GPU, unlocked), never another; put the container's freezer back as the engine left it;
remove the journal. A journal of another boot touches no process, only its image.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable

from ..cuda.driver import CudaDriver, GpuPair, ProcessState
from ..cuda.engine import CudaSession, one_line, query_states
from ..cuda.node import NodeGpus
from ..errors import DelegateError, GpuckptError
from ..host.procfs import container_pid, container_processes
from ..node.journal import (
    Journal,
    boot_id,
    pending_journals,
    read_journal,
    remove_journal,
    same_process,
)
from ..node.lock import BusyError, ContainerLock, StateKey
from ..oci.manifest import read_manifest, write_manifest
from ..trust.dump_signature import sign_dump
from .argv import parse_runtime_args
from .criu_log import dump_finished
from .delegate import container_pids, container_state, kill_container
from .freezer import Freezer
from .resolve import resolve_runtime
from .staging import is_staging_dir, move_staged

ORPHAN_WAIT_S = 60.0  # a dump or restore the killed shim's delegate still runs: waited for this long

Report = Callable[[str], None]


def finish_left_journal(key: StateKey, delegate: str, gpus: NodeGpus, report: Report) -> bool:
    """Finish the journal a killed shim left for the container (the caller holds its lock, so no
    live shim owns it); whether there was one. Each thing done is one line to `report`. A journal
    of the layout before roots for the same ID is finished too when the root it names is this one,
    under its old-named lock (a shim of the older gpuckpt may still be at work on it: BusyError)."""
    if _finish_journal(key, delegate, gpus, report):
        return True
    legacy = StateKey.legacy(key.container)
    journal = read_journal(legacy) if key.root else None
    if journal is None or journal_root(journal, delegate) != key.root:
        return False
    with ContainerLock(legacy, "recover"):
        return _finish_journal(legacy, delegate, gpus, report)


def journal_root(journal: Journal, delegate: str) -> str:
    """The runtime root a journal is for: its own field, or, in the layout before roots, its delegate's --root."""
    return journal.root or parse_runtime_args([*journal.global_argv, "state"]).runtime_root(delegate)


def _finish_journal(key: StateKey, delegate: str, gpus: NodeGpus, report: Report) -> bool:
    journal = read_journal(key)
    if journal is None:
        return False
    container, delegate = journal.container, journal.delegate or delegate  # the one the shim that wrote it ran
    if journal.shim_pid == os.getpid():
        raise GpuckptError(f"{container}: the journal names this very process")  # a bug, not a state
    this_boot = journal.boot_id == boot_id()
    if this_boot:
        _wait_for_delegate(journal)
    done: list[str] = []
    if journal.verb == "checkpoint":
        _finish_checkpoint(journal, delegate, gpus, this_boot, done)
    elif this_boot:
        _finish_restore(journal, delegate, gpus, done)
    remove_journal(key)
    what = "; ".join(done) or "nothing was left to undo"
    report(f"{container}: finished the {journal.verb} a killed gpuckpt-runtime (pid {journal.shim_pid}) left "
           f"at '{journal.phase}'{'' if this_boot else ' before the reboot'}: {what}")
    return True


def _wait_for_delegate(journal: Journal) -> None:
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while same_process(journal.delegate_pid, journal.delegate_start_time):
        if time.monotonic() > deadline:
            raise BusyError(f"{journal.container}: the {journal.verb} of a killed gpuckpt-runtime goes on in its "
                            f"delegate (pid {journal.delegate_pid}) after {ORPHAN_WAIT_S:g} s; nothing was touched "
                            "(try again when it ends)")
        time.sleep(0.1)


def recover_all(report: Report, containers: list[str] | None = None) -> int:
    """Finish each journal nobody is working on (of the containers named: under any root); how many could
    not be finished (one line each to `report`)."""
    delegate, gpus, failed = resolve_runtime().delegate, NodeGpus(), 0
    pending = pending_journals()
    for container in containers or []:
        if not any(key.container == container for key in pending):
            report(f"{container}: no journal: nothing to finish")
    for key in pending:
        if containers and key.container not in containers:
            continue
        try:
            with ContainerLock(key, "recover"):
                if not _finish_journal(key, delegate, gpus, report):
                    report(f"{key.container}: no journal: nothing to finish")  # finished meanwhile
        except BusyError as error:
            report(str(error))  # a live shim's work in progress, or its delegate's: not ours to finish
        except GpuckptError as error:
            report(f"{key.container}: {error}")
            failed += 1
    return failed


# -- checkpoint ---------------------------------------------------------------------------------


def _finish_checkpoint(journal: Journal, delegate: str, gpus: NodeGpus, this_boot: bool, done: list[str]) -> None:
    if journal.phase in ("dump", "gpu_resume", "move_staged") and _complete_image(journal):
        done.append(f"the dump had completed: image {journal.image_dir} marked complete")
    elif journal.phase != "prepared":
        done.append(f"image {journal.image_dir} stays marked incomplete (restore refuses it)")
    freezer = _freezer(journal, delegate)
    if not this_boot or not journal.gpu:
        _put_freezer_back(journal, freezer, done)
        return
    alive = [p.host_pid for p in journal.processes if same_process(p.host_pid, p.start_time)]
    if alive:
        driver = gpus.load_driver()
        session = CudaSession(driver, alive)
        session.done = {pid: ProcessState.LOCKED for pid in alive}  # rollback asks each one's state
        _thaw_for_driver(freezer)
        leftovers = session.rollback()
        if leftovers:
            done.append(f"could not resume {'; '.join(leftovers)}")
        else:
            done.append(f"{len(alive)} CUDA process(es) running again")
    gone = len(journal.processes) - len(alive)
    if gone:
        done.append(f"{gone} CUDA process(es) ended with the dump")
    _put_freezer_back(journal, freezer, done)


def _complete_image(journal: Journal) -> bool:
    finished = bool(journal.dump_began) and dump_finished(journal.work_dir or journal.image_dir, journal.dump_began)
    if journal.staging_dir and is_staging_dir(journal.staging_dir):  # none other is removed or moved
        if not finished:
            shutil.rmtree(journal.staging_dir, ignore_errors=True)  # a dump cut short, in memory
            return False
        try:
            move_staged(journal.staging_dir, journal.image_dir)
        except OSError:
            return False  # dropped (the disk full?): the image stays incomplete, the processes still resume
    manifest = read_manifest(journal.image_dir)
    if manifest is None or not finished:
        return False
    if manifest.dump_completed:
        return True
    write_manifest(journal.image_dir, manifest.model_copy(update={"dump_completed": True}))
    sign_dump(journal.image_dir)
    return True


def _thaw_for_driver(freezer: Freezer | None) -> None:
    """The driver cannot resume a frozen process: thawed for the rollback (frozen again after by
    _put_freezer_back if the engine had frozen it)."""
    try:
        if freezer is not None and freezer.is_frozen():
            freezer.set_frozen(False)
    except (OSError, GpuckptError):
        pass  # the driver says what it could not resume


def _freezer(journal: Journal, delegate: str) -> Freezer | None:
    try:
        state = container_state(delegate, journal.global_argv, journal.container)
    except DelegateError:
        return None
    return Freezer.of_process(state.pid) if state.pid else None


def _put_freezer_back(journal: Journal, freezer: Freezer | None, done: list[str]) -> None:
    """Frozen as the engine had it (docker pauses before a checkpoint), thawed otherwise (a dump
    cut short can leave the cgroup frozen)."""
    if freezer is None:
        return
    try:
        if freezer.is_frozen() != journal.refreeze:
            freezer.set_frozen(journal.refreeze)
            done.append("container frozen again as the engine had it" if journal.refreeze
                        else "container thawed")
    except (OSError, GpuckptError) as error:
        done.append(f"its freezer could not be set back ({one_line(error)})")


# -- restore ------------------------------------------------------------------------------------


def _finish_restore(journal: Journal, delegate: str, gpus: NodeGpus, done: list[str]) -> None:
    try:
        state = container_state(delegate, journal.global_argv, journal.container)
    except DelegateError:
        done.append("the container was not created: nothing to finish (its image is as it was)")
        return
    if state.status != "running":
        done.append(f"the container is {state.status}: nothing to finish")
        return
    pids = _restored_cuda_pids(journal, delegate, state.pid)
    try:
        resumed = resume_restored(gpus.load_driver(), pids, [GpuPair(*pair) for pair in journal.gpu_pairs])
    except GpuckptError as error:
        kill_container(delegate, journal.global_argv, journal.container)
        done.append(f"its CUDA processes could not be restored ({one_line(error)}): the container was stopped")
        return
    done.append(f"{resumed} CUDA process(es) restored to the GPU and unlocked")


def _restored_cuda_pids(journal: Journal, delegate: str, init_pid: int) -> list[int]:
    if journal.phase == "gpu_restore":
        return [p.host_pid for p in journal.processes if same_process(p.host_pid, p.start_time)]
    wanted = {p.container_pid for p in journal.processes}  # the delegate's restore had not ended
    listed = container_processes(container_pids(delegate, journal.global_argv, journal.container), init_pid)
    return sorted(pid for pid in listed if container_pid(pid) in wanted)


def resume_restored(driver: CudaDriver, pids: list[int], pairs: list[GpuPair]) -> int:
    """Restore (remapped by `pairs`) the checkpointed ones of `pids`, then unlock every locked one;
    how many were moved."""
    states = query_states(driver, pids)
    failed = [f"pid {pid}: {one_line(answer)}" for pid, answer in states.items() if isinstance(answer, BaseException)]
    if failed:
        raise GpuckptError("; ".join(failed))
    checkpointed = [pid for pid in pids if states[pid] == ProcessState.CHECKPOINTED]
    if checkpointed:
        CudaSession(driver, checkpointed).restore(pairs)
    locked = [pid for pid in pids if states[pid] in (ProcessState.CHECKPOINTED, ProcessState.LOCKED)]
    if locked:
        CudaSession(driver, locked).unlock()
    return len(locked)
