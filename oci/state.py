"""A container's OCI runtime state as runc and crun print it (`RT state ID`): the fields gpuckpt reads.

The runtime is trusted (the operator configured it), but its output is still parsed into this
model, so a missing or mistyped field is one DelegateError line rather than a KeyError later.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# runc's statuses (libcontainer Status); crun prints the same words.
Status = Literal["creating", "created", "running", "paused", "stopped"]


class ContainerState(BaseModel):
    # runc adds rootfs, created, owner; crun adds its own: kept, never read
    model_config = ConfigDict(extra="allow", frozen=True)

    ociVersion: str = ""
    id: str
    status: Status
    pid: int = Field(default=0, ge=0)  # 0 once the container has stopped
    bundle: str = ""
    annotations: dict[str, str] | None = None
