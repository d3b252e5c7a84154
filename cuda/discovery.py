"""Which processes of a container are CUDA processes, and can the driver restore them?

A CUDA process holds /dev/nvidia* open or mapped (the /proc scan also finds
those with no device memory yet); NVML's compute processes are added when NVML
answers. All from /proc and NVML, read-only.
"""

from __future__ import annotations

import os
from contextlib import suppress

from ..errors import DriverError
from .devices import compute_pids, pids_holding_nvidia_devices

# NCCL's P2P and cuMem transports leave state the driver cannot restore (error 801,
# seen on 2x H200): a job must run with both of these to be checkpointable.
NCCL_SAFE_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_CUMEM_ENABLE": "0"}


def find_cuda_pids(pids: list[int]) -> list[int]:
    """The CUDA processes among `pids`: the /proc scan, plus NVML's compute processes."""
    found = set(pids_holding_nvidia_devices(pids))
    with suppress(DriverError):  # NVML missing or failing: the /proc scan still found every process holding the driver
        found.update(pid for pid in compute_pids() if pid in set(pids))
    return sorted(found)


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            entries = environ.read().split(b"\0")
    except OSError:
        return {}
    pairs = (entry.decode("utf-8", "replace").partition("=") for entry in entries if entry)
    return {key: value for key, _, value in pairs}


def _uses_nccl(pid: int) -> bool:
    """A live NCCL communicator, not just the library (PyTorch maps libnccl in every CUDA process):
    libnccl mapped, and NCCL's own threads or its /dev/shm segments present."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            mapped = maps.read()
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    if "libnccl" not in mapped:
        return False
    if "/dev/shm/nccl-" in mapped:
        return True
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                if comm.read().startswith("NCCL"):
                    return True
        except OSError:
            continue
    return False


def _maps_nccl(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return "libnccl" in maps.read()
    except OSError:
        return False


def unrestorable_reason(pid: int, spans_gpus: bool = False) -> str | None:
    """Why the driver could checkpoint this process but never restore it, or None.

    NCCL's threads are unnamed unless NCCL_SET_THREAD_NAME=1 and PyTorch maps libnccl
    in every CUDA process, so a job is taken as NCCL when libnccl is mapped and either
    NCCL's own traces are seen or the container's CUDA processes span several GPUs.
    """
    if not (_uses_nccl(pid) or (spans_gpus and _maps_nccl(pid))):
        return None
    environ = _environ(pid)
    missing = [f"{key}={value}" for key, value in NCCL_SAFE_ENV.items() if environ.get(key) != value]
    if not missing:
        return None
    return (f"CUDA process {pid} runs NCCL without {' and '.join(missing)}: the driver can checkpoint it "
            f"but not restore it; start the job with {' '.join(f'{k}={v}' for k, v in NCCL_SAFE_ENV.items())} "
            "or allow it with the annotation io.gpuckpt.allow-unrestorable=true")
