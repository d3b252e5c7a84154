"""Can this node take a checkpoint's GPU state, and onto which GPUs?

Pure functions over the manifest and the node's inventory: the restore refuses
before touching anything, with every difference named.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from ..errors import GpuCheckpointError
from ..oci.manifest import Manifest
from .devices import GpuInfo
from .driver import GpuPair


def _major(version: str) -> str:
    return version.split(".", 1)[0]


def node_differences(manifest: Manifest, target: list[GpuInfo], driver_version: str, policy: str) -> list[str]:
    """What keeps this node from restoring the manifest's processes; empty if nothing."""
    problems = []
    if policy == "equal" and driver_version != manifest.driver_version:
        problems.append(f"driver {driver_version} differs from the checkpoint's {manifest.driver_version} "
                        "(policy 'equal')")
    elif policy == "same-major" and _major(driver_version) != _major(manifest.driver_version):
        problems.append(f"driver {driver_version} is not of the checkpoint's branch {_major(manifest.driver_version)} "
                        "(policy 'same-major')")
    if len(target) != len(manifest.gpus):
        problems.append(f"the container is given {len(target)} GPU(s), the checkpoint had {len(manifest.gpus)}")
    for old, new in zip(manifest.gpus, target, strict=False):  # a count that differs is the problem above
        if old.name != new.name:
            problems.append(f"GPU {new.index} is a {new.name}, the checkpoint's GPU {old.index} was a {old.name}")
    needed = memory_needed((p.gpu_uuids, p.checkpointed_bytes) for p in manifest.processes)
    for old, new in zip(manifest.gpus, target, strict=False):
        if needed.get(old.uuid, 0) > new.memory_free_bytes:
            problems.append(f"GPU {new.index} ({new.uuid}) has {new.memory_free_bytes >> 20} MiB free, "
                            f"the checkpoint needs {needed[old.uuid] >> 20} MiB")
    return problems


def memory_needed(
    usages: Iterable[tuple[Sequence[str], int]], moved: Mapping[str, str] | None = None
) -> dict[str, int]:
    """Device bytes each GPU must have free: NVML reports a process's memory on its first GPU,
    which `moved` (old -> new UUID) may send elsewhere."""
    moved = moved or {}
    needed: dict[str, int] = defaultdict(int)
    for gpu_uuids, device_bytes in usages:
        for uuid in gpu_uuids[:1]:
            needed[moved.get(uuid, uuid)] += device_bytes
    return dict(needed)


def check_node(manifest: Manifest, target: list[GpuInfo], driver_version: str, policy: str) -> None:
    problems = node_differences(manifest, target, driver_version, policy)
    if problems:
        raise GpuCheckpointError(f"restore of {manifest.container_id} refused: " + "; ".join(problems))


def gpu_pairs(manifest: Manifest, target: list[GpuInfo]) -> list[GpuPair]:
    """Old->new UUID pairs for the container's GPUs; none when nothing moved.

    The driver wants the pairs to cover every GPU the process sees (LAB: a list
    naming one of two visible GPUs failed). A container's processes see the GPUs
    its spec gives it, so the container's own mapping is complete.
    """
    pairs = [GpuPair(old.uuid, new.uuid) for old, new in zip(manifest.gpus, target, strict=True)]  # check_node: as many
    if all(pair.old_uuid == pair.new_uuid for pair in pairs):
        return []
    return pairs


def complete_pairs(pairs: list[GpuPair], old_node: list[str], new_node: list[str]) -> list[GpuPair]:
    """Extend the pairs of the moved GPUs to a permutation of all of the node's GPUs."""
    old_rest = [uuid for uuid in old_node if uuid not in {p.old_uuid for p in pairs}]
    new_rest = [uuid for uuid in new_node if uuid not in {p.new_uuid for p in pairs}]
    if len(old_rest) != len(new_rest):
        return pairs
    return pairs + [GpuPair(old, new) for old, new in zip(old_rest, new_rest, strict=True)]
