"""`gpuckpt suspend|resume|status`: free a container's GPUs without stopping it, and give them back.

The record of a suspension lives in the state directory, so it survives this command.
"""

from __future__ import annotations

import argparse
import json

from ..cuda.compat import complete_pairs
from ..cuda.driver import GpuPair
from ..cuda.node import NodeGpus
from ..cuda.suspend import STANDBY_ENGINE, recorded_pairs, resume, suspend
from ..errors import UsageError
from ..node.config import load_config
from ..node.suspension import Suspension, all_suspensions, read_suspension, remove_suspension, write_suspension
from .containers import ENGINES, find_container


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, handler, text in (("suspend", run_suspend, "move a container's GPU state to host memory, freeing its "
                                                         "GPUs"),
                                ("resume", run_resume, "bring a suspended container's GPU state back")):
        parser = commands.add_parser(name, help=text)
        parser.add_argument("container", help="name or ID (podman, docker, or runc with --root)")
        parser.add_argument("--engine", choices=ENGINES, default="auto")
        parser.add_argument("--root", help="runc's --root, for containers run by runc or this shim directly")
        if name == "resume":
            parser.add_argument("--gpu", action="append", default=[], metavar="UUID",
                                help="resume onto these GPUs, in the order of the container's GPUs")
        parser.set_defaults(handler=handler)
    status = commands.add_parser("status", help="suspended and standby containers and since when")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=run_status)


def run_suspend(options: argparse.Namespace) -> int:
    container = find_container(options.container, options.engine, options.root)
    if read_suspension(container.container_id):
        raise UsageError(f"container {options.container} is already suspended (gpuckpt resume {options.container})")
    gpus, cuda = NodeGpus(), load_config().cuda
    if not gpus.find_cuda_pids(gpus.descendants(container.init_pid)):  # before the driver: a CPU node has none
        raise UsageError(f"container {options.container} has no CUDA process: nothing to suspend (suspend frees "
                         "the GPU memory of a container's CUDA processes)")
    record = suspend(gpus.load_driver(), container.container_id, container.engine, container.init_pid,
                     cuda.lock_timeout_ms, gpus=gpus, hugepages=cuda.wants_hugepages)
    write_suspension(record)
    freed = sum(p.device_bytes for p in record.processes)
    print(f"suspended {options.container}: {len(record.processes)} CUDA process(es), "
          f"{freed / 2**30:.1f} GiB of GPU memory freed in {record.suspend_s:.2f} s")
    return 0


def _pairs(record: Suspension, uuids: list[str], gpus: NodeGpus) -> list[GpuPair]:
    if not uuids:
        return []
    old = sorted({uuid for process in record.processes for uuid in process.gpu_uuids})
    if len(uuids) != len(old):
        raise UsageError(f"--gpu: give {len(old)} GPU UUID(s), one for each GPU the container used ({', '.join(old)})")
    node = [gpu.uuid for gpu in gpus.list_gpus()]  # the driver wants every GPU the processes see covered
    return complete_pairs([GpuPair(o, n) for o, n in zip(old, uuids, strict=True)], node, node)


def run_resume(options: argparse.Namespace) -> int:
    container = find_container(options.container, options.engine, options.root)
    record = read_suspension(container.container_id)
    if record is None:
        raise UsageError(f"container {options.container} is not suspended")
    gpus = NodeGpus()
    # a standby goes where its restore's node check chose, unless told otherwise
    pairs = _pairs(record, options.gpu, gpus) if options.gpu else recorded_pairs(record)
    seconds = resume(gpus.load_driver(), record, pairs, gpus=gpus,
                     hugepages=load_config().cuda.wants_hugepages)
    remove_suspension(container.container_id)
    print(f"resumed {options.container}: {len(record.processes)} CUDA process(es) in {seconds:.2f} s")
    return 0


def run_status(options: argparse.Namespace) -> int:
    records = all_suspensions()
    if options.json:
        print(json.dumps([record.model_dump() for record in records], indent=2))
        return 0
    if not records:
        print("no suspended container")
    for record in records:
        gib = sum(p.device_bytes for p in record.processes) / 2**30
        state = "standby" if record.engine == STANDBY_ENGINE else "suspended"
        print(f"{record.container[:12]}  {record.engine:7}  {state} since {record.since}  "
              f"{len(record.processes)} CUDA process(es), {gib:.1f} GiB in host memory")
    return 0
