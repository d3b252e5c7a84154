#!/usr/bin/env python3
"""gpuckpt-runtime over a fake CUDA driver whose state outlives the process, for the fault suite.

Run as `python3 fake_gpu_runtime.py STATE_FILE <runc's command line>`: the shim's own main()
with the node's GPUs replaced at their one seam (cuda/node.NodeGpus). The driver's state
(running, locked, checkpointed, per process) lives in STATE_FILE, keyed by the PID inside the
container, so it survives the shim being SIGKILLed, CRIU's dump and restore (which keep the
container's PIDs and change the host's), and the next shim process that finishes the journal.
Its `calling` entry names the driver call in flight: the suite kills the shim on it.

Which processes are "CUDA processes": those whose container PID the state file lists.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuckpt.cuda.devices import GpuInfo
from gpuckpt.cuda.driver import CudaDriver, GpuPair, LockTimeout, ProcessState
from gpuckpt.cuda.inventory import Inventory
from gpuckpt.cuda.node import NodeGpus
from gpuckpt.errors import DriverError
from gpuckpt.host.procfs import container_pid
from gpuckpt.oci.manifest import GpuRecord
from gpuckpt.shim.main import main

UUID = "GPU-11111111-2222-3333-4444-555555555555"
NAME = "NVIDIA H100 80GB HBM3"
TRANSITIONS = {"lock": (ProcessState.RUNNING, ProcessState.LOCKED),
               "checkpoint": (ProcessState.LOCKED, ProcessState.CHECKPOINTED),
               "restore": (ProcessState.CHECKPOINTED, ProcessState.LOCKED),
               "unlock": (ProcessState.LOCKED, ProcessState.RUNNING)}


class StateFile:
    """{"processes": {container PID: state name}, "delay_s": {call: seconds}, "fail": {call: CUDA error},
    "calling": "call PID" or "", "calls": [...]} under an flock."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def update(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        with open(self.path, "r+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            data = json.load(file)
            result = change(data)
            file.seek(0)
            file.truncate()
            json.dump(data, file)
            return result

    def read(self) -> dict[str, Any]:
        with open(self.path) as file:
            fcntl.flock(file, fcntl.LOCK_SH)  # a writer truncates then writes under LOCK_EX
            return json.load(file)


class FileDriver(CudaDriver):
    def __init__(self, state: StateFile) -> None:
        self.file = state

    def driver_version(self) -> int:
        return 13000

    def init(self) -> None:
        pass

    def _move(self, call: str, pid: int) -> None:
        """The state changes at once; the call returns after its delay. A shim killed meanwhile leaves the
        process moved without knowing it, the worst case of a call in flight."""
        key = str(container_pid(pid))
        source, target = TRANSITIONS[call]

        def apply(data: dict[str, Any]) -> tuple[str, float]:
            data.setdefault("calls", []).append(f"{call} {key}")
            if (error := data.get("fail", {}).get(call)) is not None:
                return error, 0.0
            found = data["processes"].get(key)
            if found != source.name:
                return f"CUDA_ERROR_ILLEGAL_STATE ({call} of a process in state {found})", 0.0
            data["processes"][key] = target.name
            data["calling"] = f"{call} {key}"
            return "", data.get("delay_s", {}).get(call, 0.0)

        problem, delay_s = self.file.update(apply)
        time.sleep(delay_s)
        self.file.update(lambda data: data.__setitem__("calling", ""))
        if problem == "CUDA_ERROR_TIMEOUT":
            raise LockTimeout(f"cuCheckpointProcessLock(pid {pid}) failed: CUDA_ERROR_TIMEOUT", problem)
        if problem:
            raise DriverError(f"cuCheckpointProcess{call.title()}(pid {pid}) failed: {problem}", problem)

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._move("lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._move("checkpoint", pid)

    def restore(self, pid: int, gpu_pairs: Sequence[GpuPair] = ()) -> None:
        self._move("restore", pid)

    def unlock(self, pid: int) -> None:
        self._move("unlock", pid)

    def state(self, pid: int) -> ProcessState:
        found = self.file.read()["processes"].get(str(container_pid(pid)))
        if found is None:
            raise DriverError(f"cuCheckpointProcessGetState(pid {pid}) failed: CUDA_ERROR_NOT_INITIALIZED",
                              "CUDA_ERROR_NOT_INITIALIZED")
        return ProcessState[found]


def fake_node(state: StateFile) -> NodeGpus:
    gpu = GpuInfo(index=0, uuid=UUID, name=NAME, memory_total_bytes=80 << 30, memory_free_bytes=79 << 30, minor=0)
    listed = lambda pids: [pid for pid in pids if str(container_pid(pid)) in state.read()["processes"]]  # noqa: E731
    return NodeGpus(
        load_driver=lambda: FileDriver(state),
        find_cuda_pids=listed,
        unrestorable_reason=lambda pid, spans: None,
        release_forked_children=lambda pids: [],
        list_gpus=lambda: [gpu],
        compute_processes=lambda: {},
        driver_version_string=lambda: "580.159.04",
        describe_container_gpus=lambda spec, pids: Inventory(
            driver_version="580.159.04", cuda_driver_version=13000,
            gpus=[GpuRecord(index=0, uuid=UUID, name=NAME, memory_total_bytes=80 << 30)], node_gpu_uuids=[UUID],
            memory_bytes={pid: 1 << 20 for pid in pids}, process_gpus={pid: [UUID] for pid in pids}),
        container_gpus=lambda spec, pids, gpus=None: [gpu],
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:], gpus=fake_node(StateFile(sys.argv[1]))))
