"""gpuckptd's formats: the local API (one JSON request line, then JSON event lines on the unix
socket) and the record each drained container leaves beside its checkpoint.

Only root reaches the socket (the service checks the peer's credentials); the records are root's
files in the archive directory. Both are still parsed into these models, so a stray line or a
damaged record is one error naming it, never a KeyError later.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import GpuckptError
from ..oci.problems import first_problem

CONTAINER_ID_PATTERN = r"^[A-Za-z0-9_+][A-Za-z0-9_+.-]{0,199}$"  # node/inventory.py's rule
MAX_LINE_BYTES = 1 << 20
DrainEngine = Literal["podman", "docker"]  # the engines gpuckptd acts through (runc bundles: not yet)


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Request(_Message):
    op: Literal["status", "drain", "restore", "reset", "pool-take", "pool-status"]
    deadline_s: float | None = Field(default=None, gt=0, le=86_400)  # drain: start nothing after this
    checkpoint: str | None = Field(default=None, max_length=4096)  # pool-take: which checkpoint's standby
    # drain: only these recorded containers, by full ID (the CLI resolves names), and their groups' other members
    containers: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = Field(default=[], max_length=4096)


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


PreemptionState = Literal["watching", "draining", "drained"]  # service/preemption.py's state machine


class Preemption(_Message):
    """Where the preemption watch stands: watching its sources; draining on a notice; drained (the
    notice handled: periodic checkpoints paused, later notices part of this one) until `gpuckpt
    service reset` or the service's next start."""

    state: PreemptionState
    sources: list[str]  # what is watched: the URL, the file, SIGUSR1
    source: str = ""  # what gave the notice
    noticed_at: str | None = None  # UTC, as "2026-11-23T17:00:04Z"
    deadline_at: str | None = None  # UTC: when the notice says the node goes (or preemption_deadline_s after it)
    drain: str = ""  # the drain's result line, once it ended


class Scheduled(_Message):
    """A recorded container's periodic checkpoint: how often, the last, the next."""

    id: str
    engine: str
    every_min: float | None = None  # None: not checkpointed periodically
    last_at: str | None = None  # UTC, this service's last try
    last: str = ""  # its outcome: the checkpoint's path, or "failed: ..."
    next_at: str | None = None  # UTC


class Periodic(_Message):
    every_min: float  # service.checkpoint_every_min (0: only annotated containers)
    paused: str = ""  # why periodic checkpoints (and idle reclaim) wait, if they do
    containers: list[Scheduled] = []


class Status(_Message):
    event: Literal["status"] = "status"
    recorded: list[str]  # the inventory's containers
    drained: list[str]  # waiting in the archive directory for a restore
    names: dict[str, str] = {}  # the engine's name of each recorded or drained container that has one, by ID
    busy: str | None = None  # the operation under way
    # None from a service without them (an older one, or one still starting)
    drains_on_stop: bool | None = None  # whether stopping the service drains (gpuckptd --drain-on-stop)
    preemption: Preemption | None = None
    periodic: Periodic | None = None


class PoolEntry(_Message):
    container: str
    checkpoint: str
    host_bytes: int = Field(ge=0)
    created: str


class PoolState(_Message):
    """The warm pool (service/pool.py): its standbys, how many each checkpoint should have, the memory held."""

    event: Literal["pool"] = "pool"
    standbys: list[PoolEntry]
    wanted: dict[str, int]
    held_bytes: int = Field(ge=0)
    budget_bytes: int = Field(ge=0)


Event = Plan | ContainerEvent | Result | Status | PoolState


class DrainedContainer(_Message):
    """ARCHIVE_DIR/ID.json: a container checkpointed by a drain, waiting to be restored."""

    version: Literal[1] = 1
    id: str = Field(pattern=CONTAINER_ID_PATTERN)
    engine: DrainEngine
    checkpoint: str = Field(pattern=r"^/")  # podman: the archive; docker: the --checkpoint-dir
    drained_at: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    bytes: int = Field(ge=0)
    seconds: float = Field(ge=0)
    # a member of a group (podman label io.gpuckpt.group): drained with the others in podman's own store
    # (`checkpoint` is podman's checkpoint directory of it) and restored with them (gpuckpt restore --group)
    group: str = Field(default="", max_length=253)


class ApiError(GpuckptError):
    """A line on gpuckptd's socket that is not one of its messages."""


def parse_request(line: bytes) -> Request:
    try:
        return Request.model_validate_json(line)
    except ValidationError as error:
        raise ApiError(f"gpuckptd: not a request: {first_problem(error)} "
                       "(ops: status, drain, restore, reset, pool-take, pool-status)") from None


def parse_event(line: bytes) -> Event:
    for model in (ContainerEvent, Plan, Result, Status, PoolState):
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
