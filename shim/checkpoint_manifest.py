"""The checkpoint's manifest: written marked incomplete before the dump (an image cut short is refused
at restore), marked complete once the dump succeeded, then the dump signed with the node's key. A
lazy dump is marked "lazy, completing" and signed in between, when its page server is ready.

What it records comes from the plan (the delegate's argv, CRIU's network options and config lines, the driver
files the processes map),
the node's GPU inventory and the processes as the checkpoint found them.
"""

from __future__ import annotations

import contextlib
import os
import time

from ..cuda.engine import one_line
from ..cuda.inventory import Inventory
from ..cuda.plugin import gpu_handler
from ..errors import GpuCheckpointError
from ..oci.manifest import CudaProcessRecord, Manifest, Timings, write_manifest
from ..oci.timestamps import utc_now
from ..policy.spec_grants import grants_of
from ..trust.dump_signature import DUMP_SIGNATURE, sign_dump
from .checkpoint_plan import CheckpointPlan


def write_checkpoint_manifest(plan: CheckpointPlan, inventory: Inventory, pid_in_container: dict[int, int],
                              started: float, *, dump_s: float, completed: bool, downtime_s: float | None = None,
                              timings: dict[str, float] | None = None, lazy_ready: bool = False) -> None:
    """The manifest of `plan`'s checkpoint of the CUDA processes `pid_in_container` names (host PID ->
    container PID; none for a plain dump), `started` at that time.monotonic(). A lazy plan's dump is
    marked lazy once its page server was ready (`lazy_ready`) and when it completed."""
    timings = timings or {}
    manifest = Manifest(
        created=utc_now(),
        container_id=plan.container_id,
        driver_version=inventory.driver_version,
        cuda_driver_version=inventory.cuda_driver_version,
        gpus=inventory.gpus,
        node_gpu_uuids=inventory.node_gpu_uuids,
        processes=[CudaProcessRecord(host_pid=pid, container_pid=container_pid,
                                     checkpointed_bytes=inventory.memory_bytes.get(pid, 0),
                                     gpu_uuids=inventory.process_gpus.get(pid, []))
                   for pid, container_pid in pid_in_container.items()],
        gpu_handler=gpu_handler(bool(pid_in_container)),
        delegate=plan.delegate,
        delegate_args=plan.argv,
        leave_running=plan.leave_running,
        network=plan.network,
        criu_config=plan.criu_config,
        timings=Timings(lock_s=timings.get("lock_s", 0.0),
                        device_checkpoint_s=timings.get("device_checkpoint_s", 0.0),
                        dump_s=dump_s, total_s=time.monotonic() - started, downtime_s=downtime_s),
        dump_completed=completed,
        lazy_pages=plan.lazy_pages and (completed or lazy_ready),
        driver_files=plan.driver_files,
        spec_grants=grants_of(plan.spec, plan.container_id),
    )
    write_manifest(plan.image_dir, manifest)


def begin_manifest(plan: CheckpointPlan, inventory: Inventory, pid_in_container: dict[int, int], started: float,
                   left: str) -> None:
    """Before the dump: the manifest marked incomplete; `left` says how a failure leaves the container."""
    try:
        write_checkpoint_manifest(plan, inventory, pid_in_container, started, dump_s=0.0, completed=False)
    except OSError as error:
        raise GpuCheckpointError(f"checkpoint of {plan.container_id} failed before the dump: its manifest could "
                                 f"not be written ({one_line(error)}); {left}") from None


def complete_manifest(plan: CheckpointPlan, inventory: Inventory, pid_in_container: dict[int, int], started: float,
                      *, dump_s: float, downtime_s: float | None = None,
                      timings: dict[str, float] | None = None) -> bool:
    """The dump succeeded: the manifest marked complete and the dump signed; whether it was signed
    (False: this node has no key)."""
    try:
        write_checkpoint_manifest(plan, inventory, pid_in_container, started, dump_s=dump_s, downtime_s=downtime_s,
                                  timings=timings, completed=True)
    except OSError as error:
        container = "keeps running" if plan.leave_running else "was stopped by the dump"
        raise GpuCheckpointError(f"checkpoint of {plan.container_id} failed: the dump completed but its manifest "
                                 f"could not be completed ({one_line(error)}): restore refuses the image; the "
                                 f"container {container}") from None
    return sign_dump(plan.image_dir) is not None


def lazy_manifest(plan: CheckpointPlan, inventory: Inventory, started: float) -> bool:
    """A lazy dump's page server is ready: the manifest marked "lazy, completing" and the images written so far
    signed, before the engine starts the lazy restore; whether they were signed."""
    try:
        write_checkpoint_manifest(plan, inventory, {}, started, dump_s=time.monotonic() - started, completed=False,
                                  lazy_ready=True)
    except OSError as error:
        raise GpuCheckpointError(f"checkpoint of {plan.container_id} failed: the lazy dump's manifest could not "
                                 f"be written ({one_line(error)}): restore refuses the image") from None
    return sign_dump(plan.image_dir) is not None


def lazy_dump_failed(plan: CheckpointPlan, inventory: Inventory, started: float) -> None:
    """A lazy dump that ended in failure after its page server was ready: marked incomplete again, its
    signature removed, so that restore refuses it as a dump that never completed."""
    with contextlib.suppress(OSError):
        write_checkpoint_manifest(plan, inventory, {}, started, dump_s=time.monotonic() - started, completed=False)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(plan.image_dir, DUMP_SIGNATURE))
