"""`gpuckpt-runtime pause|resume` for containers that opted in: suspend their CUDA processes
before the freeze, resume them after the thaw (`podman pause`, `docker pause`).

Opt-in is the annotation io.gpuckpt.suspend-on-pause=true or `cuda.suspend_on_pause` in
the config; every other container's pause and resume go to the delegate unchanged.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from ..errors import DelegateError, GpuckptError
from ..node.config import load_config
from ..node.suspension import read_suspension, remove_suspension, write_suspension
from ..oci.spec import container_annotations
from .argv import RuntimeArgs, parse_verb_args
from .delegate import container_state, run_delegate
from .log import log
from .resolve import exec_delegate

if TYPE_CHECKING:
    from ..cuda.node import NodeGpus
    from ..oci.state import ContainerState

SUSPEND_ON_PAUSE_ANNOTATION = "io.gpuckpt.suspend-on-pause"
PAUSE_ENGINE = "pause"  # the suspension record's engine when a pause made it


def run(args: RuntimeArgs, delegate: str, gpus: NodeGpus | None = None) -> int:
    verb = parse_verb_args(args.command_args, frozenset())
    container_id, state = verb.container_id, None
    if container_id is not None:
        with contextlib.suppress(DelegateError):
            state = container_state(delegate, args.global_argv, container_id)
    if container_id is None or state is None or not _opted_in(state):
        exec_delegate(delegate, args.argv)
    # Deferred: the GPU side (the driver binding, NVML, ptrace) only for containers that opted
    # in; every other container's pause and resume is the delegate's alone (exec'd above).
    from ..cuda.node import NodeGpus
    from ..node.lock import ContainerLock, StateKey
    from .recover import finish_left_journal

    gpus = gpus or NodeGpus()
    key = StateKey.of(container_id, args.runtime_root(delegate))
    with ContainerLock(key, args.command or "pause"):  # not beside a checkpoint or restore of it
        finish_left_journal(key, delegate, gpus, lambda line: log(args, "warning", line))
        if args.command == "pause":
            return _pause(args, delegate, container_id, state.pid, gpus)
        return _resume(args, delegate, container_id, gpus)


def _opted_in(state: ContainerState) -> bool:
    return (
        container_annotations(state).get(SUSPEND_ON_PAUSE_ANNOTATION) == "true" or load_config().cuda.suspend_on_pause
    )


def _pause(args: RuntimeArgs, delegate: str, container_id: str, init_pid: int, gpus: NodeGpus) -> int:
    from ..cuda.suspend import resume, suspend  # the GPU side, as above

    if read_suspension(container_id) is not None or not gpus.find_cuda_pids(gpus.descendants(init_pid)):
        # a standby or suspended container holds no GPU already: frozen as it is, and the resume after the
        # thaw leaves it so (its record is not the pause's)
        return run_delegate(delegate, args.argv)
    driver, cuda = gpus.load_driver(), load_config().cuda
    hugepages = cuda.wants_hugepages
    record = suspend(driver, container_id, PAUSE_ENGINE, init_pid, cuda.lock_timeout_ms, gpus=gpus, hugepages=hugepages)
    write_suspension(record)
    status = run_delegate(delegate, args.argv)
    if status != 0:  # not frozen after all: give the GPU state back
        resume(driver, record, gpus=gpus, hugepages=hugepages)
        remove_suspension(container_id)
        return status
    log(args, "info", f"{container_id}: {len(record.processes)} CUDA process(es) suspended before the freeze "
        f"in {record.suspend_s:.2f} s")
    return 0


def _resume(args: RuntimeArgs, delegate: str, container_id: str, gpus: NodeGpus) -> int:
    from ..cuda.suspend import resume  # the GPU side, as above

    status = run_delegate(delegate, args.argv)
    record = read_suspension(container_id)
    if status != 0 or record is None or record.engine != PAUSE_ENGINE:
        return status
    try:
        seconds = resume(gpus.load_driver(), record, gpus=gpus, hugepages=load_config().cuda.wants_hugepages)
    except GpuckptError as error:
        raise DelegateError(f"{container_id} is thawed but its GPU state is not back: {error}") from None
    remove_suspension(container_id)
    log(args, "info", f"{container_id}: {len(record.processes)} CUDA process(es) resumed after the thaw in "
                      f"{seconds:.2f} s")
    return 0
