"""A job that spans containers (one rank each), checkpointed and restored through podman as one: the
members are the containers labelled io.gpuckpt.group=LABEL.

Checkpoint, in order: the members found, every one running; every member's CUDA processes locked, then
checkpointed, at once (cuda/group.py: no rank is left waiting on a locked peer); each member dumped by
`podman container checkpoint` (the shim dumps a suspended container as it is, so podman's view is the
truth: checkpointed, or running with --leave-running); with --leave-running, every member put back on
the GPU together. Restore, in order: each member restored by `podman container restore` into standby
(the shim leaves its GPU state in host memory: node/suspension.py's standby request), then every
member's GPU state brought back and unlocked together, so the ranks meet again.

Each step registers its undo as it is done (shim/rollback.py). A member that fails any phase puts the
whole group back, and the one line names the member and the cause: a checkpoint, every member running
as before with its GPU state back (members already dumped restored into standby first); a restore,
every member checkpointed as before (members already restored stopped, their checkpoints kept by
podman's --keep).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from ..cuda.group import GroupMember, GroupMemberFailed, GroupSuspend, resume_group
from ..cuda.node import NodeGpus
from ..cuda.suspend import STANDBY_ENGINE, recorded_pairs
from ..errors import GpuckptError, NotFoundError, UsageError
from ..host import process
from ..host.loopback_hold import LoopbackHold
from ..host.programs import find_program
from ..node.suspension import ask_standby_restore, read_suspension, remove_suspension, take_standby_request
from ..shim.rollback import Rollback

GROUP_LABEL = "io.gpuckpt.group"
ENGINE_TIMEOUT_S = 3600.0


class GroupFailed(GpuckptError):
    """A member failed a phase and the group was put back (or `leftovers` say what could not be)."""


@dataclass(frozen=True)
class GroupOptions:
    leave_running: bool = False
    tcp_established: bool = False  # podman's --tcp-established, for the ranks' connections
    lock_timeout_ms: int = 10_000
    hugepages: bool = False


@dataclass(frozen=True)
class Found:
    """A member as podman sees it now."""

    name: str
    container_id: str
    pid: int
    status: str  # podman's: running, exited, ...
    network_mode: str = ""  # podman's: "container:ID" for a pod's members (ID: its infra container)

    def member(self) -> GroupMember:
        return GroupMember(self.name, self.container_id, self.pid)


def _podman() -> str:
    found = find_program("podman")
    if found is None:
        raise NotFoundError("podman is not on PATH: a group is checkpointed through podman")
    return found


def find_members(label: str) -> list[Found]:
    """The members: podman's containers labelled io.gpuckpt.group=`label`, by name."""
    podman = _podman()
    if not label or any(character in label for character in "=,\n"):
        raise UsageError(f"--group {label!r}: give the value of the label {GROUP_LABEL} (no '=', ',' or newline)")
    listed = process.run([podman, "ps", "-a", "--filter", f"label={GROUP_LABEL}={label}", "--format", "{{.ID}}"],
                         timeout_s=60)
    if not listed.stdout.split():
        raise NotFoundError(f"no podman container carries the label {GROUP_LABEL}={label}")
    return sorted((_inspect(podman, name) for name in listed.stdout.split()), key=lambda found: found.name)


def _inspect(podman: str, name: str) -> Found:
    """One member as podman sees it now."""
    inspected = process.run([podman, "inspect", "--type", "container", "--format",
                             "{{.Name}}\t{{.Id}}\t{{.State.Pid}}\t{{.State.Status}}\t{{.HostConfig.NetworkMode}}",
                             name], timeout_s=60, check=False)
    if inspected.returncode != 0:
        raise NotFoundError(f"member {name}: no such podman container")
    shown, container_id, pid, status, network_mode = inspected.stdout.strip("\n").split("\t")
    return Found(shown, container_id, int(pid) if status == "running" else 0, status, network_mode)


def _podman_run(verb: str, flags: Sequence[str], member: str) -> None:
    """`podman container VERB FLAGS MEMBER`, its failure a GpuckptError naming the member and podman's line."""
    try:
        process.run([_podman(), "container", verb, *flags, member], timeout_s=ENGINE_TIMEOUT_S)
    except GpuckptError as error:
        raise GpuckptError(f"member {member}: {error}") from None  # "podman container VERB: Error: ..."


def _restore_into_standby(found: Found, tcp_established: bool) -> Found:
    """The member restored by podman, its GPU state left in host memory (in podman's store: --keep, so that
    a group that fails later can stop it and still have its checkpoint); as podman sees it then."""
    ask_standby_restore(found.container_id)
    try:
        _podman_run("restore", ["--keep", *(["--tcp-established"] if tcp_established else [])], found.name)
    finally:
        take_standby_request(found.container_id)  # a restore that never reached the shim leaves none behind
    return _inspect(_podman(), found.name)


def _resume_all(members: Sequence[Found], gpus: NodeGpus, hugepages: bool) -> list[str]:
    """Every member's GPU state back together (a standby's GPUs as its restore chose them); records removed.
    The members with GPU state in host memory are those with a suspension record: the group's lock, or the
    standby restore's (a member without CUDA processes has none, and no driver is loaded for it)."""
    suspended, pairs = [], {}
    for found in members:
        record = read_suspension(found.container_id)
        if record is None:
            continue
        suspended.append(found.member())
        if record.engine == STANDBY_ENGINE:
            pairs[found.container_id] = recorded_pairs(record)
    resumed = resume_group(suspended, gpus, pairs=pairs, hugepages=hugepages)
    for found in members:
        remove_suspension(found.container_id)
    return resumed


def _loopback_hold(members: Sequence[Found]) -> LoopbackHold | None:
    """The hold on the loopback the members share (a pod's network namespace, its infra container's): None where
    they share none that outlives them (each its own namespace, or the host's, which is never held)."""
    modes = {found.network_mode for found in members}
    owner = next(iter(modes)).removeprefix("container:") if len(modes) == 1 else ""
    if not owner or owner == next(iter(modes)) or any(found.container_id == owner for found in members):
        return None
    inspected = process.run([_podman(), "inspect", "--type", "container", "--format", "{{.State.Pid}}", owner],
                            timeout_s=60, check=False)
    pid = int(inspected.stdout.strip() or 0) if inspected.returncode == 0 else 0
    if pid <= 0:
        raise GpuckptError(f"the members share the network namespace of container {owner[:12]}, which is not running")
    return LoopbackHold(pid)


def _held(what: str, members: Sequence[Found], work: Callable[[], list[str]]) -> list[str]:
    """`work` with the members' shared loopback held (if they share one), released after it, done or not."""
    hold = _loopback_hold(members)
    if hold is None:
        return work()
    hold.hold()
    try:
        done = work()
    except GroupFailed as failed:
        raise GroupFailed("; ".join([str(failed), *hold.release()])) from None
    except BaseException:
        hold.release()
        raise
    if left := hold.release():
        raise GroupFailed(f"group {what} done, but {left[0]}")
    return done


def checkpoint_group(members: Sequence[Found], options: GroupOptions, gpus: NodeGpus) -> list[str]:
    """The group checkpointed through podman (see the module's phases); the members' names."""
    if not members:
        raise UsageError("a group checkpoint needs at least one member")
    if idle := [f"{found.name} ({found.status})" for found in members if found.status != "running"]:
        raise UsageError(f"every member must be running; not: {', '.join(idle)}")
    for found in members:
        if read_suspension(found.container_id) is not None:
            raise UsageError(f"member {found.name} is suspended already (gpuckpt resume {found.name})")
    return _held("checkpoint", members, lambda: _checkpoint_group(members, options, gpus))


def _checkpoint_group(members: Sequence[Found], options: GroupOptions, gpus: NodeGpus) -> list[str]:
    suspend = GroupSuspend([found.member() for found in members], gpus)
    try:
        suspend.suspend(options.lock_timeout_ms, hugepages=options.hugepages)
    except GroupMemberFailed as failed:  # every member put back already (cuda/group.py)
        raise GroupFailed(f"group checkpoint failed: {failed}") from None
    rollback = Rollback()
    rollback.done("gpu", lambda: _back_on_gpu(members, gpus, options.hugepages))
    flags = [flag for flag, wanted in (("--leave-running", options.leave_running),
                                       ("--tcp-established", options.tcp_established)) if wanted]
    try:
        for found in members:
            _podman_run("checkpoint", flags, found.name)
            if not options.leave_running:
                rollback.done(f"dump {found.name}", partial(_undump, found, options.tcp_established))
        if options.leave_running:  # every member's dump is written: all back on the GPU together
            _resume_all(members, gpus, options.hugepages)
    except BaseException as error:  # noqa: BLE001 -- a rollback boundary (^C too): the whole group back
        raise _rolled_back("checkpoint", error, rollback) from None
    return [found.name for found in members]


def _undump(found: Found, tcp_established: bool) -> list[str]:
    """A dumped member back, into standby (the group's GPU undo brings every member's GPU state back after)."""
    try:
        _restore_into_standby(found, tcp_established)
    except GpuckptError as error:
        return [f"member {found.name} could not be restored ({error}); its checkpoint is kept by podman"]
    return []


def _back_on_gpu(members: Sequence[Found], gpus: NodeGpus, hugepages: bool) -> list[str]:
    """Every member's GPU state back and unlocked, as podman sees them now (a member restored has a new pid)."""
    try:
        now = [_inspect(_podman(), found.name) for found in members]
        _resume_all([found for found in now if found.status == "running"], gpus, hugepages)
    except GpuckptError as error:
        return [str(error)]
    return []


def restore_group(members: Sequence[Found], options: GroupOptions, gpus: NodeGpus) -> list[str]:
    """The group restored through podman, each member into standby, then every GPU state back together."""
    if not members:
        raise UsageError("a group restore needs at least one member")
    # podman refuses a member without a checkpoint itself (rolling the group back); one running has its own
    if running := [found.name for found in members if found.status == "running"]:
        raise UsageError(f"every member must be stopped with its checkpoint in podman's store; running: "
                         f"{', '.join(running)}")
    return _held("restore", members, lambda: _restore_group(members, options, gpus))


def _restore_group(members: Sequence[Found], options: GroupOptions, gpus: NodeGpus) -> list[str]:
    rollback = Rollback()
    restored: list[Found] = []
    try:
        for found in members:
            restored.append(_restore_into_standby(found, options.tcp_established))
            rollback.done(f"restore {found.name}", partial(_stop, restored[-1]))
        _resume_all(restored, gpus, options.hugepages)
    except BaseException as error:  # noqa: BLE001 -- a rollback boundary (^C too): every member as it was
        raise _rolled_back("restore", error, rollback) from None
    for found in members:  # every member back: what podman's restore without --keep removes, removed
        _drop_kept_checkpoint(found)
    return [found.name for found in members]


def _drop_kept_checkpoint(found: Found) -> None:
    """The member's checkpoint directory in podman's store (kept by --keep while the group could fail): it
    holds the processes' memory, GPU state included."""
    shown = process.run([_podman(), "inspect", "--type", "container", "--format", "{{.StaticDir}}", found.name],
                        timeout_s=60, check=False)
    static_dir = shown.stdout.strip()
    if shown.returncode == 0 and os.path.isabs(static_dir):
        shutil.rmtree(os.path.join(static_dir, "checkpoint"), ignore_errors=True)


def _stop(found: Found) -> list[str]:
    """A restored member stopped again; its checkpoint stays in podman's store (--keep)."""
    remove_suspension(found.container_id)
    try:
        process.run([_podman(), "kill", found.name], timeout_s=300)
        process.run([_podman(), "wait", found.name], timeout_s=300, check=False)
    except GpuckptError as error:
        return [f"member {found.name} could not be stopped again ({error})"]
    return []


def _rolled_back(what: str, error: BaseException, rollback: Rollback) -> GroupFailed:
    cause = str(error) if isinstance(error, GpuckptError) else "interrupted" \
        if isinstance(error, KeyboardInterrupt) else f"{type(error).__name__}: {error}"
    leftovers = rollback.run()
    if leftovers:
        return GroupFailed(f"group {what} failed: {cause}; rollback left: {'; '.join(leftovers)}")
    state = "every member runs as before, its GPU state back" if what == "checkpoint" else \
        "every member is checkpointed as before"
    return GroupFailed(f"group {what} failed: {' '.join(cause.split())}; {state}")
