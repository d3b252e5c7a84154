"""The node's GPUs and which processes use them: NVML (pynvml) and /proc, read-only.

pynvml is imported inside the functions that need it, so the shim's hot path never pays for it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from ..errors import DriverError
from ..host.procfs import fd_targets
from ..oci.nvidia_paths import NVIDIA_DEVICE_PREFIX


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str  # nvidia-smi form, GPU-xxxxxxxx-...
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    minor: int = -1  # N of /dev/nvidiaN; -1 where NVML could not say


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older pynvml returns bytes


@contextmanager
def _nvml(purpose: str) -> Iterator[Any]:
    """pynvml, initialised for one query; every NVML failure becomes a one-line DriverError."""
    try:
        # Deferred: the gpu extra is optional, and a checkpoint of a container without GPU
        # (which loads this module through cuda/node.py) must not pay for loading NVML.
        import pynvml
    except ImportError:
        raise DriverError(f"cannot {purpose}: NVML's Python binding is missing (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise DriverError(f"cannot {purpose}: NVML did not start: {error}") from None
    try:
        yield pynvml
    except pynvml.NVMLError as error:
        raise DriverError(f"cannot {purpose}: NVML failed: {error}") from None
    finally:
        with suppress(pynvml.NVMLError):  # the answer is already in hand
            pynvml.nvmlShutdown()


def _minor(nvml: Any, handle: Any) -> int:
    try:
        return int(nvml.nvmlDeviceGetMinorNumber(handle))
    except nvml.NVMLError:
        return -1


def list_gpus() -> list[GpuInfo]:
    """Every GPU of the node, in NVML's index order."""
    with _nvml("list the GPUs") as nvml:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(GpuInfo(index=index, uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                                name=_text(nvml.nvmlDeviceGetName(handle)),
                                memory_total_bytes=int(memory.total), memory_free_bytes=int(memory.free),
                                minor=_minor(nvml, handle)))
        return gpus


def compute_processes() -> dict[int, dict[str, int]]:
    """Host pid -> {GPU UUID: device memory bytes} for every process with a compute context."""
    with _nvml("list the GPU processes") as nvml:
        usage: dict[int, dict[str, int]] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = process.usedGpuMemory or 0  # None where the driver does not report it
                usage.setdefault(int(process.pid), {})[uuid] = int(used)
        return usage


def utilization_by_uuid() -> dict[str, int]:
    """Each GPU's utilization (percent of the last sample period a kernel ran), by UUID."""
    with _nvml("read GPU utilization") as nvml:
        found = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            found[_text(nvml.nvmlDeviceGetUUID(handle))] = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        return found


def compute_pids() -> dict[int, list[str]]:
    """Host pid -> UUIDs of the GPUs where it has a compute context."""
    return {pid: list(gpus) for pid, gpus in compute_processes().items()}


def driver_version_string() -> str:
    """The kernel driver's version, e.g. "580.159.04"."""
    with _nvml("read the driver version") as nvml:
        return _text(nvml.nvmlSystemGetDriverVersion())


def loaded_module_version(root: str = "/") -> str | None:
    """The loaded kernel module's version without NVML (which needs the driver's userland): /sys/module/nvidia/
    version, else /proc/driver/nvidia/version's "Kernel Module ... 580.159.04"; None where no module is loaded."""
    for relative, pattern in (("sys/module/nvidia/version", r"(\d+\.\d+(?:\.\d+)?)"),
                              ("proc/driver/nvidia/version", r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")):
        try:
            with open(os.path.join(root, relative)) as source:
                found = re.search(pattern, source.read(4096))
        except OSError:
            continue
        if found:
            return found.group(1)
    return None


def cuda_driver_version() -> int:
    """The CUDA version the driver supports, encoded as cuDriverGetVersion does (13000)."""
    with _nvml("read the CUDA driver version") as nvml:
        return int(nvml.nvmlSystemGetCudaDriverVersion())


def _holds_nvidia_device(pid: int) -> bool:
    """An fd open on /dev/nvidia*, or a /dev/nvidia* mapping (which a checkpointed process keeps)."""
    if any(target.startswith(NVIDIA_DEVICE_PREFIX) for _, target in fd_targets([pid])):
        return True
    try:
        with open(f"/proc/{pid}/maps") as maps:
            # the path is the sixth field (a name with spaces stays whole): a file named "x /dev/nvidia0" is not it
            return any(len(fields) == 6 and fields[5].startswith(NVIDIA_DEVICE_PREFIX)
                       for fields in (line.split(maxsplit=5) for line in maps))
    except OSError:
        return False  # gone, or not ours to read


def pids_holding_nvidia_devices(pids: Iterable[int]) -> set[int]:
    """The pids among `pids` that hold the NVIDIA driver open, device memory or not."""
    return {pid for pid in pids if _holds_nvidia_device(pid)}
