"""Kubernetes' calls on a GPU container through containerd 2.1's CRI (issues 14 and 32): cri_gpu.py's scenario as a
pytest GPU scenario. With `--inject cdi` the pod's container is what a cluster runs: the self-contained image
(image.py: its own Python, torch and CUDA runtime) pulled by the nodes from an OCI layout on loopback, the GPU
asked for as `nvidia.com/gpu=0` in ContainerConfig.CDI_devices (a device plugin in CDI mode), the driver brought by
the node's CDI spec (/etc/cdi/nvidia.yaml, cdi.py) alone. Checkpointed by CheckpointContainer into an archive (left
running), restored by CreateContainer from the archive in a new pod on the same node and on a second node: the same
process each time, its device data intact, the spec's edits in each container. Needs `pack-carry.sh containerd`."""

from __future__ import annotations

import harness
import pytest

pytestmark = pytest.mark.gpu


def test_cri_gpu(results: dict) -> None:
    import cri_gpu  # its import puts nothing on the machine: harness.install() ran in the gpu_run fixture

    if not cri_gpu.CONTAINERD.exists():
        pytest.skip("the carry pack has no containerd (integration/gpu/pack-carry.sh containerd)")
    results["cri_inject"] = harness.INJECT
    found: dict = {}
    results["cri_cdi" if harness.INJECT == "cdi" else "cri_binds"] = found
    cri_gpu.scenario(found, "1")
