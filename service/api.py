"""gpuckptd's formats: the local API (one JSON request line, then JSON event lines on the unix
socket) and the record each drained container leaves beside its checkpoint.

Only root reaches the socket (the service checks the peer's credentials); the records are root's
files in the archive directory. Both are still parsed into these models, so a stray line or a
damaged record is one error naming it, never a KeyError later.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import GpuckptError
from ..oci.problems import first_problem

CONTAINER_ID_PATTERN = r"^[A-Za-z0-9_+][A-Za-z0-9_+.-]{0,199}$"  # node/inventory.py's rule
MAX_LINE_BYTES = 1 << 20
DrainEngine = Literal["podman", "docker"]  # the engines gpuckptd acts through (runc bundles: not yet)


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Request(_Message):
    op: Literal["status", "drain", "restore"]
    deadline_s: float | None = Field(default=None, gt=0, le=86_400)  # drain: start nothing after this


class ContainerEvent(_Message):
    """One container's step: started, then done, failed or skipped (with why)."""

    event: Literal["container"] = "container"
    id: str
    name: str = ""  # the engine's name for it, where it answered (a gpuckptd before issue 33 sends none)
    engine: str
    phase: Literal["checkpoint", "restore"]
    state: Literal["started", "done", "failed", "skipped"]
    message: str = ""
    bytes: int = 0
    seconds: float = 0.0


class Plan(_Message):
    """What a drain or restore is about to work on, sent before its first container (absent from
    a gpuckptd older than the client: its progress then counts with no total). A client parses
    only the events it knows, so client and service come from one install (an upgrade leaves the
    running service older than its client, never newer)."""

    event: Literal["plan"] = "plan"
    phase: Literal["checkpoint", "restore"]
    containers: int = Field(ge=0)
    bytes: int = Field(default=0, ge=0)  # checkpoint: the containers' host memory now, a floor; restore: exact


class Result(_Message):
    event: Literal["result"] = "result"
    ok: bool
    message: str
    done: list[str] = []
    failed: list[str] = []
    skipped: list[str] = []


class Status(_Message):
    event: Literal["status"] = "status"
    recorded: list[str]  # the inventory's containers
    drained: list[str]  # waiting in the archive directory for a restore
    busy: str | None = None  # the operation under way


Event = Plan | ContainerEvent | Result | Status


class DrainedContainer(_Message):
    """ARCHIVE_DIR/ID.json: a container checkpointed by a drain, waiting to be restored."""

    version: Literal[1] = 1
    id: str = Field(pattern=CONTAINER_ID_PATTERN)
    engine: DrainEngine
    checkpoint: str = Field(pattern=r"^/")  # podman: the archive; docker: the --checkpoint-dir
    drained_at: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    bytes: int = Field(ge=0)
    seconds: float = Field(ge=0)


class ApiError(GpuckptError):
    """A line on gpuckptd's socket that is not one of its messages."""


def parse_request(line: bytes) -> Request:
    try:
        return Request.model_validate_json(line)
    except ValidationError as error:
        raise ApiError(f"gpuckptd: not a request: {first_problem(error)} (ops: status, drain, restore)") from None


def parse_event(line: bytes) -> Event:
    for model in (ContainerEvent, Plan, Result, Status):
        try:
            return model.model_validate_json(line)
        except ValidationError:
            continue
    raise ApiError(f"gpuckptd sent a line that is not an event: {line[:120]!r}")


def parse_drained(data: bytes, where: str) -> DrainedContainer:
    try:
        return DrainedContainer.model_validate_json(data)
    except ValidationError as error:
        raise ApiError(f"{where}: not a drain record: {first_problem(error)}") from None
