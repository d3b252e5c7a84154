"""What one checkpoint will do, decided up front from the engine's argv, the node's config, the
container's spec and annotations; the CRIU options (network, config lines) and the driver files the
processes map are added to it once the container's processes were read, before anything is touched.

shim/checkpoint.py makes one CheckpointPlan per attempt; the manifest records from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..node.config import Config, load_config
from ..node.paths import config_path
from ..oci.manifest import DriverFileRecord, NetworkPolicy
from ..oci.spec import Spec, container_annotations, read_spec
from ..oci.state import ContainerState
from ..policy.annotations import refuse_runtime_annotations
from .argv import RuntimeArgs, VerbArgs, delegate_argv, image_dir_of
from .freezer import Freezer


@dataclass(frozen=True)
class CheckpointPlan:
    container_id: str
    delegate: str
    image_dir: str  # where the engine wants the images (and the manifest, and the signature)
    work_dir: str  # where CRIU writes its log: --work-path, else the image directory
    work_path: str | None  # --work-path as the engine gave it
    leave_running: bool  # --leave-running: the CUDA processes are restored and unlocked after the dump
    pre_dump: bool
    lazy_pages: bool  # --lazy-pages: the pages stay with CRIU's page server until a lazy restore took them
    config: Config
    spec: Spec
    annotations: dict[str, str]
    frozen_by_engine: bool  # as the engine left it (docker pauses before a checkpoint): how a recovery puts it back
    argv: list[str]  # what the delegate gets: the engine's argv, plus the options chosen below
    network: NetworkPolicy = field(default_factory=NetworkPolicy)  # CRIU's network options, and why
    criu_config: list[str] = field(default_factory=list)  # the lines of the shim's CRIU config file
    driver_files: list[DriverFileRecord] = field(default_factory=list)  # the NVIDIA libraries the processes map

    @property
    def gpu(self) -> bool:
        return self.spec.wants_gpu()


def plan_checkpoint(args: RuntimeArgs, verb: VerbArgs, container_id: str, delegate: str,
                    state: ContainerState) -> CheckpointPlan:
    """The plan, refused (policy/annotations.py) where the container's annotations ask for what the operator
    does not allow."""
    image_dir = image_dir_of(verb)
    work_path = verb.value("work-path")
    config, spec, annotations = load_config(), read_spec(state.bundle), container_annotations(state)
    argv = delegate_argv(delegate, args)
    freezer = Freezer.of_process(state.pid)
    try:
        frozen_by_engine = freezer is not None and freezer.is_frozen()
    except OSError:
        frozen_by_engine = False
    # The container may not choose CRIU options the operator has not allowed it
    refuse_runtime_annotations(annotations, container_id, config.criu, config_path(),
                               [state.bundle, spec.rootfs(state.bundle)])
    return CheckpointPlan(container_id=container_id, delegate=delegate, image_dir=image_dir,
                          work_dir=os.path.abspath(work_path or image_dir), work_path=work_path,
                          leave_running=verb.has("leave-running"), pre_dump=verb.has("pre-dump"),
                          lazy_pages=verb.has("lazy-pages"),
                          config=config, spec=spec, annotations=annotations,
                          frozen_by_engine=frozen_by_engine, argv=argv)
