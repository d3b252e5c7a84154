"""This node's GPUs as the shim's verbs and `gpuckpt suspend` reach them: the driver binding, NVML's
inventory, which processes are CUDA processes and the process tree they are found in.

The verbs take one `NodeGpus` as an argument; the unit tests pass one built on
tests/fake_driver.py, so no test replaces a module's function behind the code's back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..host import procfs
from . import devices, discovery, driver, forked, inventory


@dataclass(frozen=True)
class NodeGpus:
    """Each field is the real function unless a test gives its own."""

    load_driver: Callable[[], driver.CudaDriver] = driver.load_driver
    find_cuda_pids: Callable[[list[int]], list[int]] = discovery.find_cuda_pids
    descendants: Callable[[int], list[int]] = procfs.descendants
    unrestorable_reason: Callable[[int, bool], str | None] = discovery.unrestorable_reason
    release_forked_children: Callable[[list[int]], list[forked.DeviceHold]] = forked.release_forked_children
    list_gpus: Callable[[], list[devices.GpuInfo]] = devices.list_gpus
    compute_processes: Callable[[], dict[int, dict[str, int]]] = devices.compute_processes
    driver_version_string: Callable[[], str] = devices.driver_version_string
    describe_container_gpus: Callable[..., inventory.Inventory] = inventory.describe_container_gpus
    container_gpus: Callable[..., list[devices.GpuInfo]] = inventory.container_gpus
