"""The GPUs a container has and what its CUDA processes hold on them, from NVML.

Feeds the manifest at checkpoint time and the node check and UUID remap at
restore time. GPUs are matched by the minor number of /dev/nvidiaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..host.procfs import fd_targets
from ..oci.manifest import GpuRecord
from ..oci.nvidia_paths import gpu_minor
from ..oci.spec import Spec
from .devices import GpuInfo, compute_processes, cuda_driver_version, driver_version_string, list_gpus


@dataclass
class Inventory:
    driver_version: str
    cuda_driver_version: int
    gpus: list[GpuRecord]
    node_gpu_uuids: list[str] = field(default_factory=list)
    memory_bytes: dict[int, int] = field(default_factory=dict)  # pid -> device bytes
    process_gpus: dict[int, list[str]] = field(default_factory=dict)  # pid -> GPU UUIDs


def minors_held_by(pids: list[int]) -> set[int]:
    """Minor numbers of the /dev/nvidiaN a process has open (when the spec does not list them)."""
    return {minor for _, target in fd_targets(pids) if (minor := gpu_minor(target)) is not None}


def container_gpus(spec: Spec, cuda_pids: list[int], gpus: list[GpuInfo] | None = None) -> list[GpuInfo]:
    """The node's GPUs that the container is given, in index order."""
    gpus = list_gpus() if gpus is None else gpus
    minors = set(spec.gpu_minors()) or minors_held_by(cuda_pids)
    if not minors:  # e.g. NVIDIA_VISIBLE_DEVICES=all through a hook: every GPU
        return gpus
    return [gpu for gpu in gpus if gpu.minor in minors]


def describe_container_gpus(spec: Spec, cuda_pids: list[int]) -> Inventory:
    node_gpus = list_gpus()
    gpus = container_gpus(spec, cuda_pids, node_gpus)
    usage = compute_processes()
    return Inventory(
        driver_version=driver_version_string(),
        cuda_driver_version=cuda_driver_version(),
        gpus=[GpuRecord(index=gpu.index, uuid=gpu.uuid, name=gpu.name, memory_total_bytes=gpu.memory_total_bytes)
              for gpu in gpus],
        node_gpu_uuids=[gpu.uuid for gpu in node_gpus],
        memory_bytes={pid: sum(usage.get(pid, {}).values()) for pid in cuda_pids},
        process_gpus={pid: sorted(usage.get(pid, {})) for pid in cuda_pids},
    )
