"""One record of the node's GPU container inventory (node/inventory.py), as gpuckpt-hook writes it.

The hook writes it with `json` (pydantic costs ~100 ms of its start-up, paid on every
container start); this model reads it back, and tests/test_hook.py checks that every record
the hook writes is one this model accepts.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ImageError
from ..oci.problems import first_problem

RECORD_VERSION = 1
SHORT_ID_LENGTH = 12  # podman ps, docker ps: what every view and log line shows of an ID


def short_id(container_id: str) -> str:
    return container_id[:SHORT_ID_LENGTH]


def container_label(name: str | None, container_id: str) -> str:
    """A container as `podman ps` shows it: its name and short ID ("web (3f2a9c1b0d4e)"); the short ID
    alone where it has no name, or the name alone where the ID is not known."""
    if not container_id:
        return name or "?"
    return f"{name} ({short_id(container_id)})" if name and name != container_id else short_id(container_id)


# Which engine made the container, so the service acts through that engine and no other.
Engine = Literal["podman", "docker", "containerd", "cri-o", "runc"]


class RecordedGpu(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    minor: int = Field(ge=0, le=255)
    uuid: str = Field(pattern=r"^GPU-[0-9a-fA-F-]{1,64}$")


class ContainerRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: Literal[1]
    id: str = Field(pattern=r"^[A-Za-z0-9_+][A-Za-z0-9_+.-]{0,199}$")
    engine: Engine
    bundle: str = Field(pattern=r"^/", max_length=4096)
    pid: int = Field(ge=0)
    gpus: list[RecordedGpu]
    visible_devices: str | None = Field(default=None, max_length=1024)  # NVIDIA_VISIBLE_DEVICES, if no device nodes
    created: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    # its io.gpuckpt.* annotations (the owner's requests to the service: checkpoint-every, idle-suspend-after)
    options: dict[str, str] = Field(default={}, max_length=16)

    def minutes(self, key: str) -> int | None:
        """An annotation's whole number of minutes (io.gpuckpt.KEY), or None when absent or not one."""
        value = self.options.get(f"io.gpuckpt.{key}", "")
        if not re.fullmatch(r"[0-9]{1,6}", value, re.ASCII):  # str.isdigit() takes "²", which int() refuses
            return None
        return int(value) if 0 < int(value) <= 525_600 else None


def parse_record(data: bytes, where: str) -> ContainerRecord:
    try:
        return ContainerRecord.model_validate_json(data)
    except ValidationError as error:
        raise ImageError(f"{where}: not a gpuckpt container record: {first_problem(error)}") from None
