"""What gpuckptd does, each reporting container by container: drain (every recorded container
checkpointed through its engine, in parallel up to a limit, the smallest first so that under a
deadline the most make it), restore what was drained, and say where things stand. The members of a
group (podman label io.gpuckpt.group) are drained and restored as one (service/group.py, through
`gpuckpt checkpoint|restore --group`, in podman's own store): a rank moved alone would wait for ever.

A drain leaves ARCHIVE_DIR/ID.json beside each checkpoint (oci/service_api.DrainedContainer);
a restore removes the checkpoint and the record of a container it brought back and keeps both
of one it could not.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Literal, TypedDict, TypeVar

from ..errors import GpuckptError
from ..host.procfs import descendants, resident_bytes
from ..host.safefiles import open_directory, private_directory, require_private, write_private_at
from ..node.config import ServiceConfig
from ..node.container_record import ContainerRecord, container_label
from ..node.inventory import recorded_containers, remove_record
from ..oci.timestamps import utc_now
from . import through_engine
from .api import ContainerEvent, DrainedContainer, Event, Plan, Result, Status, parse_drained
from .systemd import log, notify

RECORD_SUFFIX = ".json"
Emit = Callable[[Event], None]
T = TypeVar("T")


@dataclass(frozen=True)
class Candidate:
    record: ContainerRecord
    estimated_bytes: int  # host memory of its processes now: what the checkpoint will at least write


def unheard(_: Event) -> None:
    """The events of work no client asked for (at start, at stop, on a preemption notice): the journal has them."""


class Facts(TypedDict):
    """The journal fields that name a container's step."""

    CONTAINER_ID: str
    ENGINE: str
    PHASE: str


def facts(container: ContainerRecord | DrainedContainer, phase: str) -> Facts:
    return {"CONTAINER_ID": container.id, "ENGINE": container.engine, "PHASE": phase}


def _named(container: ContainerRecord | DrainedContainer, phase: Literal["checkpoint", "restore"]) -> ContainerEvent:
    """The container's first event, with the engine's name for it; the lines logged of it name it as
    `podman ps` does (`label`)."""
    return ContainerEvent(id=container.id, name=through_engine.name(container.engine, container.id) or "",
                          engine=container.engine, phase=phase, state="started")


def label(event: ContainerEvent) -> str:
    return f"{event.engine} container {container_label(event.name, event.id)}"


def recorded() -> list[ContainerRecord]:
    """The inventory's containers; a record that does not parse is logged and left out."""
    return recorded_containers(lambda message, container_id: log(message, CONTAINER_ID=container_id))


def smallest_first(records: list[ContainerRecord]) -> list[Candidate]:
    candidates = [Candidate(record, resident_bytes(descendants(record.pid)) if record.pid else 0)
                  for record in records]
    return sorted(candidates, key=lambda candidate: (candidate.estimated_bytes, candidate.record.id))


def grouped(candidates: list[Candidate]) -> dict[str, list[Candidate]]:
    """The running podman containers of each group (label io.gpuckpt.group): moved together, never one alone."""
    groups: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        if candidate.record.engine == "podman" and (name := through_engine.group_of(candidate.record)):
            groups.setdefault(name, []).append(candidate)
    return groups


def with_groups(records: list[ContainerRecord], only: Sequence[str]) -> list[ContainerRecord]:
    """The records of `only` (full IDs), and every other recorded member of a group one of them is in."""
    chosen = [record for record in records if record.id in only]
    labels = {label for record in chosen if (label := through_engine.group_of(record))}
    return chosen + [record for record in records if record not in chosen and record.engine == "podman" and labels
                     and through_engine.group_of(record) in labels]


def drained(archive_dir: str) -> list[DrainedContainer]:
    """The drain records in the archive directory, oldest first; a damaged one is reported and kept."""
    try:
        directory = open_directory(archive_dir)
    except FileNotFoundError:
        return []
    found = []
    try:
        require_private(directory, archive_dir)
        for name in sorted(os.listdir(directory)):
            if not name.endswith(RECORD_SUFFIX):
                continue
            path = os.path.join(archive_dir, name)
            try:
                record = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
                with os.fdopen(record, "rb") as text:
                    found.append(parse_drained(text.read(1 << 20), path))
            except (OSError, GpuckptError) as error:
                log(f"{path}: {error}")
    finally:
        os.close(directory)
    return sorted(found, key=lambda record: record.drained_at)


class Operations:
    """The service's operations; one of them at a time."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self._busy = threading.Lock()
        self.busy: str | None = None
        self._background = False  # the operation under way is the service's own (exclusive_call), not asked

    def status(self) -> Status:
        records, waiting = recorded(), drained(self.config.archive_dir)
        listed: dict[str, str] = {}
        engines = {record.engine for record in records} | {record.engine for record in waiting}
        for engine in sorted(engines):  # one call per engine, not one per container
            listed.update(through_engine.names(engine) or {})
        ids = [record.id for record in records] + [record.id for record in waiting]
        return Status(recorded=[record.id for record in records], drained=[record.id for record in waiting],
                      names={cid: listed[cid] for cid in ids if cid in listed}, busy=self.busy)

    def _acquire(self, wait: bool) -> bool:
        """The lock for an asked operation: it waits for the service's own work under way (a periodic
        checkpoint, a record check: seconds, and the operator cannot see them coming) and, with `wait`, for
        anything; another asked drain or restore under way refuses it."""
        while not self._busy.acquire(timeout=0.1):
            if not wait and self.busy is not None and not self._background:
                return False
        return True

    def _exclusive(self, name: str, emit: Emit, work: Callable[[], Result], wait: bool = False) -> Result:
        if not self._acquire(wait):
            result = Result(ok=False, message=f"gpuckptd is busy: {self.busy} under way; try again when it ends")
            emit(result)
            return result
        self.busy = name
        try:
            result = work()
        finally:
            self.busy = None
            self._busy.release()
        emit(result)
        return result

    def exclusive_call(self, name: str, work: Callable[[], T]) -> T:
        """`work` while no other operation runs; a GpuckptError when one is under way (the caller tries later)."""
        if not self._busy.acquire(blocking=False):
            raise GpuckptError(f"gpuckptd is busy: {self.busy} under way")
        self.busy, self._background = name, True
        try:
            return work()
        finally:
            self.busy, self._background = None, False
            self._busy.release()

    def drain(self, emit: Emit, deadline_s: float | None = None, wait: bool = False,
              only: Sequence[str] = ()) -> Result:
        """`wait`: after the operation under way (a preemption's or a shutdown's drain), not refused for it.
        The deadline counts from the call. `only`: these recorded containers' full IDs (and every other member of
        a group one is in), not all of them."""
        called = time.monotonic()
        return self._exclusive("drain", emit, lambda: self._drain(emit, deadline_s, called, only), wait)

    def restore(self, emit: Emit) -> Result:
        return self._exclusive("restore", emit, lambda: self._restore(emit))

    def _drain(self, emit: Emit, deadline_s: float | None, started: float, only: Sequence[str] = ()) -> Result:
        candidates = smallest_first(with_groups(recorded(), only) if only else recorded())
        archive_fd = private_directory(self.config.archive_dir)
        outcomes: dict[str, str] = {}
        counted = threading.Lock()
        finished = written = 0

        def one(candidate: Candidate) -> None:
            nonlocal finished, written
            record = candidate.record
            report = _named(record, "checkpoint")
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                outcomes[record.id] = "skipped"
                emit(report.model_copy(update={"state": "skipped", "message": f"the {deadline_s:g} s deadline passed"}))
                return
            if record.engine not in through_engine.DRAINED_ENGINES:
                outcomes[record.id] = "failed"  # it may well be running: say so, never "not running"
                emit(report.model_copy(update={"state": "failed", "message": f"{record.engine} containers are not "
                                               "drained by gpuckptd (podman and docker are): it stays as it is"}))
                return
            if not through_engine.is_running(record):
                outcomes[record.id] = "skipped"
                gone = not through_engine.exists(record.engine, record.id)
                if gone:
                    remove_record(record.id, record.bundle)  # its engine forgot it without a poststop hook
                emit(report.model_copy(update={"state": "skipped", "message": "no longer exists: record removed"
                                               if gone else "not running"}))
                return
            emit(report)
            log(f"checkpoint of {label(report)} started", **facts(record, "checkpoint"))
            began = time.monotonic()
            try:
                engine, where, size = through_engine.checkpoint(record, self.config.archive_dir)
            except GpuckptError as error:
                outcomes[record.id] = "failed"
                log(f"checkpoint of {label(report)} failed: {error}", **facts(record, "checkpoint"))
                emit(report.model_copy(update={"state": "failed", "message": str(error)}))
                return
            seconds = round(time.monotonic() - began, 3)
            kept = DrainedContainer(id=record.id, engine=engine, checkpoint=where, drained_at=utc_now(), bytes=size,
                                    seconds=seconds)
            write_private_at(archive_fd, f".{record.id}.tmp", kept.model_dump_json().encode())
            os.replace(f".{record.id}.tmp", record.id + RECORD_SUFFIX, src_dir_fd=archive_fd, dst_dir_fd=archive_fd)
            outcomes[record.id] = "done"
            with counted:
                finished, written = finished + 1, written + size
                notify(_status("drain", finished, len(candidates), "checkpointed", written))
            log(f"checkpointed {label(report)}", **facts(record, "checkpoint"), BYTES=size, SECONDS=seconds)
            emit(report.model_copy(update={"state": "done", "message": where, "bytes": size, "seconds": seconds}))

        groups = grouped(candidates)
        units: list[Callable[[], None]] = [
            *(partial(one, candidate) for candidate in candidates
              if not any(candidate in members for members in groups.values())),
            *(partial(self._drain_group, name, members, emit=emit, archive_fd=archive_fd, outcomes=outcomes,
                      past_deadline=lambda: deadline_s is not None and time.monotonic() - started > deadline_s)
              for name, members in groups.items())]
        try:
            emit(Plan(phase="checkpoint", containers=len(candidates),
                      bytes=sum(candidate.estimated_bytes for candidate in candidates)))
            notify(_status("drain", 0, len(candidates), "checkpointed", 0))
            with ThreadPoolExecutor(max_workers=self.config.drain_parallel, thread_name_prefix="drain") as pool:
                list(pool.map(lambda unit: unit(), units))
        finally:
            os.close(archive_fd)
        return _result("drain", outcomes, time.monotonic() - started)

    def _restore(self, emit: Emit) -> Result:
        """What a drain left, restored up to drain_parallel at a time, smallest first (most containers
        back soonest); a failure keeps its checkpoint and record."""
        started = time.monotonic()
        outcomes: dict[str, str] = {}
        waiting = sorted(drained(self.config.archive_dir), key=lambda record: (record.bytes, record.id))
        counted = threading.Lock()
        restored = restored_bytes = 0
        waiting_bytes = sum(record.bytes for record in waiting)

        def one(record: DrainedContainer) -> None:
            nonlocal restored, restored_bytes
            report = _named(record, "restore")
            emit(report)
            began = time.monotonic()
            try:
                through_engine.restore(record)
            except GpuckptError as error:
                outcomes[record.id] = "failed"
                log(f"restore of {label(report)} failed, checkpoint kept at {record.checkpoint}: {error}",
                    **facts(record, "restore"))
                emit(report.model_copy(update={"state": "failed", "message": f"{error} (kept: {record.checkpoint})"}))
                return
            seconds = round(time.monotonic() - began, 3)
            through_engine.discard(record)
            os.unlink(os.path.join(self.config.archive_dir, record.id + RECORD_SUFFIX))
            outcomes[record.id] = "done"
            with counted:
                restored, restored_bytes = restored + 1, restored_bytes + record.bytes
                notify(_status("restore", restored, len(waiting), "restored", restored_bytes,
                               total_bytes=waiting_bytes))
            log(f"restored {label(report)}", **facts(record, "restore"), BYTES=record.bytes, SECONDS=seconds)
            emit(report.model_copy(update={"state": "done", "bytes": record.bytes, "seconds": seconds}))

        by_group: dict[str, list[DrainedContainer]] = {}
        for record in waiting:
            if record.group:
                by_group.setdefault(record.group, []).append(record)
        units: list[Callable[[], None]] = [*(partial(one, record) for record in waiting if not record.group),
                                           *(partial(self._restore_group, name, members, emit, outcomes)
                                             for name, members in by_group.items())]
        emit(Plan(phase="restore", containers=len(waiting), bytes=waiting_bytes))
        notify(_status("restore", 0, len(waiting), "restored", 0, total_bytes=waiting_bytes))
        with ThreadPoolExecutor(max_workers=self.config.drain_parallel, thread_name_prefix="restore") as pool:
            list(pool.map(lambda unit: unit(), units))
        return _result("restore", outcomes, time.monotonic() - started)

    def _drain_group(self, name: str, members: list[Candidate], *, emit: Emit, archive_fd: int,
                     outcomes: dict[str, str], past_deadline: Callable[[], bool]) -> None:
        """A group's members (podman label io.gpuckpt.group) checkpointed together, never one alone; a drain
        record for every member, recorded in the inventory or not: all come back together."""
        reports = {candidate.record.id: _named(candidate.record, "checkpoint") for candidate in members}
        if past_deadline():
            for container_id, report in reports.items():
                outcomes[container_id] = "skipped"
                emit(report.model_copy(update={"state": "skipped", "message": "the deadline passed"}))
            return
        for report in reports.values():
            emit(report)
        log(f"checkpoint of group {name} ({len(members)} recorded member(s)) started")
        began = time.monotonic()
        try:
            checkpointed = through_engine.checkpoint_group(name, leave_running=False)
        except GpuckptError as error:
            log(f"checkpoint of group {name} failed: {error}")
            for container_id, report in reports.items():
                outcomes[container_id] = "failed"
                emit(report.model_copy(update={"state": "failed", "message": str(error)}))
            return
        seconds = round(time.monotonic() - began, 3)
        for container_id, (where, size) in checkpointed.items():
            kept = DrainedContainer(id=container_id, engine="podman", checkpoint=where, drained_at=utc_now(),
                                    bytes=size, seconds=seconds, group=name)
            write_private_at(archive_fd, f".{container_id}.tmp", kept.model_dump_json().encode())
            os.replace(f".{container_id}.tmp", container_id + RECORD_SUFFIX, src_dir_fd=archive_fd,
                       dst_dir_fd=archive_fd)
            outcomes[container_id] = "done"
            report = reports.get(container_id) or _named(kept, "checkpoint")
            emit(report.model_copy(update={"state": "done", "message": f"group {name}: {where}", "bytes": size,
                                           "seconds": seconds}))
        log(f"checkpointed group {name}: {len(checkpointed)} member(s)", SECONDS=seconds)

    def _restore_group(self, name: str, members: list[DrainedContainer], emit: Emit,
                       outcomes: dict[str, str]) -> None:
        """A group drained together restored together (gpuckpt restore --group): every member or none."""
        reports = {record.id: _named(record, "restore") for record in members}
        for report in reports.values():
            emit(report)
        began = time.monotonic()
        try:
            through_engine.restore_group(name)
        except GpuckptError as error:
            log(f"restore of group {name} failed, every member's checkpoint kept: {error}")
            for record in members:
                outcomes[record.id] = "failed"
                emit(reports[record.id].model_copy(update={"state": "failed", "message": str(error)}))
            return
        seconds = round(time.monotonic() - began, 3)
        for record in members:
            through_engine.discard(record)
            os.unlink(os.path.join(self.config.archive_dir, record.id + RECORD_SUFFIX))
            outcomes[record.id] = "done"
            emit(reports[record.id].model_copy(update={"state": "done", "bytes": record.bytes, "seconds": seconds}))
        log(f"restored group {name}: {len(members)} member(s)", SECONDS=seconds)


def _status(what: str, done: int, total: int, verb: str, done_bytes: int, *, total_bytes: int | None = None) -> str:
    """systemd's STATUS= line for an operation under way: containers done of all, and their bytes
    (of all, where known: a drain's checkpoints are only known once written)."""
    of_bytes = f" of {total_bytes / 2**30:.1f}" if total_bytes is not None else ""
    return f"STATUS={what}: {done} of {total} {verb}, {done_bytes / 2**30:.1f}{of_bytes} GiB"


def _result(what: str, outcomes: dict[str, str], seconds: float) -> Result:
    by_state = {state: sorted(cid for cid, outcome in outcomes.items() if outcome == state)
                for state in ("done", "failed", "skipped")}
    message = (f"{what}: {len(by_state['done'])} done, {len(by_state['failed'])} failed, "
               f"{len(by_state['skipped'])} skipped in {seconds:.1f} s")
    return Result(ok=not by_state["failed"], message=message, done=by_state["done"], failed=by_state["failed"],
                  skipped=by_state["skipped"])
