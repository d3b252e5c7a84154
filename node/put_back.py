"""A failed or interrupted `gpuckpt export` or `gpuckpt store checkpoint` puts its container back: no
workload left down in silence.

podman writes its export into our FIFO opened read-write (Go's os.Create), so closing our end never
fails its write: it blocks for ever, holding the container's lock. So the stream is drained to nowhere
until podman ends (its checkpoint completes and is recorded), then the container, if stopped, is
restored from the checkpoint podman keeps; where that fails, the one command that does is said. Before
all that, a container podman does not know is said as such (not found), not as podman's checkpoint failing.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import sys
import time
from typing import NoReturn

from ..errors import GpuckptError, ImageError, NotFoundError, UsageError
from ..host.process import Background, run
from ..host.signals import Terminated, termination_deferred

DRAIN_READ_BYTES = 1 << 20
CHECKPOINT_INVENTORY = "inventory.img"  # CRIU's first image: podman restores only a checkpoint that has it


CHECKPOINTABLE = ("running", "paused")  # the states podman's checkpoint takes a container in


def require_container(podman: str, container: str) -> None:
    """podman knows `container` (name or ID) and it runs, before it is asked to checkpoint it: else not found
    (podman's own checkpoint would fail as the engine failing, with its "no such container" last), or one line
    naming its state: a failed checkpoint of a stopped container would be "put back" by restoring an older
    checkpoint podman kept, starting what its operator had left stopped (the trial of 2026-11-28b)."""
    inspected = run([podman, "container", "inspect", "--format", "{{.State.Status}}", container], check=False)
    if inspected.returncode != 0:
        if run([podman, "container", "exists", container], check=False).returncode == 1:  # 1: none; 125: failed
            raise NotFoundError(f"no container {container!r} in podman (podman ps -a lists them)")
        return  # podman failing: its checkpoint says how
    if (state := inspected.stdout.strip()) not in CHECKPOINTABLE:
        raise UsageError(f"{container} is {state or 'in no state podman names'}, not running: podman checkpoints "
                         f"only a running container (`podman start {container}` starts it; "
                         f"`podman container restore {container}` where it was checkpointed)")


def drain_until_ended(fifo: str, podman_run: Background, container: str, command: str = "export") -> None:
    """Read podman's export into nothing until podman ends; before it opens the FIFO (CRIU dumping), wait.
    Asked again meanwhile, it still waits: a podman killed mid-checkpoint leaves runc and CRIU to stop the
    container unrecorded, the very state this module is for; the shim's own dump timeouts bound the wait."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # opens at once, writer or not
    told = False
    try:
        while podman_run.running():
            try:
                _drain_once(fd)
            except KeyboardInterrupt:
                if not told:
                    print(f"gpuckpt {command}: waiting for podman to finish its checkpoint of {container}, "
                          "to put it back", file=sys.stderr)
                    told = True
    finally:
        os.close(fd)


def _drain_once(fd: int) -> None:
    chunk = b""
    if select.select([fd], [], [], 0.2)[0]:
        with contextlib.suppress(BlockingIOError):
            chunk = os.read(fd, DRAIN_READ_BYTES)
    if not chunk:
        time.sleep(0.05)  # no writer yet, or one that left: a FIFO then reads as ended at once


def put_back(podman: str, container: str, podman_run: Background, fifo: str, *, tcp_established: bool,
             command: str = "export") -> str | None:
    """podman wound down and `container` running again where podman stopped it; what became of it, as a clause
    (None where podman knows no such container: nothing was stopped)."""
    drain_until_ended(fifo, podman_run, container, command)
    podman_run.popen.wait()
    # podman keeps a checkpoint in its userdata (StaticDir); 4.3's .State.CheckpointPath may be empty
    inspected = run([podman, "container", "inspect", "--format", "{{.State.Running}} {{.StaticDir}}", container],
                    check=False)
    running, _, userdata = inspected.stdout.strip().partition(" ")
    checkpoint = os.path.join(userdata, "checkpoint") if userdata else ""
    if inspected.returncode != 0 and run([podman, "container", "exists", container], check=False).returncode == 1:
        return None
    if inspected.returncode == 0 and running == "true":
        return f"{container} is still running"
    if userdata and not os.path.exists(os.path.join(checkpoint, CHECKPOINT_INVENTORY)):
        # not stopped by this checkpoint (never started, or podman failed before CRIU dumped): a restore cannot
        # bring it back (podman: "a complete checkpoint ... cannot be found"), and saying it would was wrong
        return f"{container} is not running and podman kept no checkpoint of it: `podman start {container}` starts it"
    restore = ["podman", "container", "restore", *(["--tcp-established"] if tcp_established else []), container]
    restored = None
    with contextlib.suppress(Terminated), termination_deferred():  # a podman restore killed mid-way is worse
        restored = run([podman, *restore[1:]], check=False)
    if restored is not None and restored.returncode == 0:
        return f"{container} restored from podman's checkpoint and running again"
    kept = f" (its checkpoint is kept in {checkpoint})" if checkpoint else ""
    return f"{container} is stopped: `{shlex.join(restore)}` brings it back{kept}"


def raise_with_outcome(command: str, failure: BaseException, outcome: str, where: str, *, podman_run: Background,
                       podman_waited: bool) -> NoReturn:
    """The failure as one line that also says what became of the container (`outcome`: what was kept, what
    put_back said)."""
    if isinstance(failure, KeyboardInterrupt):  # main prints nothing for these: their line is ours
        print(f"gpuckpt {command}: interrupted; {outcome}", file=sys.stderr)
        raise failure
    if isinstance(failure, ImageError) and not podman_waited and podman_run.popen.returncode:
        # a stream cut short is most often podman failing: then its message is the one to show
        try:
            podman_run.wait(check=True)
        except GpuckptError as podman_failed:
            failure = podman_failed
    if isinstance(failure, OSError):  # a full disk: name the file it could not write
        raise OSError(failure.errno, f"{failure.strerror or failure}; {outcome}",
                      failure.filename or where) from None
    if isinstance(failure, GpuckptError):
        failure.args = (f"{failure}; {outcome}",)
    raise failure
