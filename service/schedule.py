"""What gpuckptd does on its own time: periodic checkpoints and idle GPU reclaim.

Periodic: every service.checkpoint_every_min for every recorded container, or as often as its
io.gpuckpt.checkpoint-every=MINUTES annotation asks (never more often than
checkpoint_min_interval_min), a --leave-running checkpoint into archive_dir/periodic/ID/, the
newest checkpoint_keep kept. Idle: a container annotated io.gpuckpt.idle-suspend-after=MINUTES
whose GPUs all read 0 % utilization for that long (at least idle_min_minutes) is suspended.
Both wait while a preemption is pending (service/preemption.py); the records of containers removed
behind the hook's back are dropped either way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable

from ..cuda.devices import utilization_by_uuid
from ..errors import GpuckptError
from ..host.safefiles import make_directories, private_directory
from ..node.config import ServiceConfig
from ..node.container_record import ContainerRecord, container_label, short_id
from ..node.inventory import remove_record
from ..node.suspension import read_suspension
from ..oci.timestamps import utc_at
from . import through_engine
from .api import Periodic, Scheduled
from .operations import Operations, facts, recorded
from .systemd import log

PERIODIC_DIR = "periodic"
RECORD_CHECK_S = 30.0  # how often the records are held to their engines (a podman inspect each)


def checkpoint_interval_s(record: ContainerRecord, config: ServiceConfig) -> float | None:
    asked = record.minutes("checkpoint-every")
    minutes = max(asked, config.checkpoint_min_interval_min) if asked else config.checkpoint_every_min
    return minutes * 60.0 if minutes else None


def prune(directory: str, keep: int) -> list[str]:
    """Remove all but the newest `keep` checkpoints in `directory` (names sort by time); what went."""
    names = _checkpoint_names(directory)
    gone = names[:-keep] if len(names) > keep else []
    for name in gone:
        prune_named(directory, name)
    return gone


def _checkpoint_paths(directory: str, name: str) -> tuple[str, str, str]:
    """One checkpoint in `directory`: docker's directory NAME, or podman's NAME.tar.zst and its signature."""
    return (os.path.join(directory, name), os.path.join(directory, f"{name}.tar.zst"),
            os.path.join(directory, f"{name}.tar.zst.sig"))


def prune_named(directory: str, name: str) -> None:
    """Remove one checkpoint of `directory` (_checkpoint_paths), following no link."""
    for path in _checkpoint_paths(directory, name):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


def _checkpoint_names(directory: str) -> list[str]:
    return sorted({name.removesuffix(".sig").removesuffix(".tar.zst") for name in os.listdir(directory)})


def _checkpoint_bytes(directory: str, name: str) -> int:
    total = 0
    for path in _checkpoint_paths(directory, name):
        if os.path.isdir(path):
            total += sum(os.lstat(os.path.join(root, entry)).st_size for root, _, entries in os.walk(path)
                         for entry in entries)
        elif os.path.lexists(path):
            total += os.lstat(path).st_size
    return total


def prune_to_budget(periodic_root: str, budget_bytes: int, recorded_ids: set[str]) -> list[str]:
    """Remove the oldest periodic checkpoints of every container until all of them fit `budget_bytes`,
    never the newest of a container in `recorded_ids`; what went, as ID/NAME."""
    if not budget_bytes or not os.path.isdir(periodic_root):
        return []
    found = []  # (name: its time, container id, bytes, removable)
    for container_id in sorted(os.listdir(periodic_root)):
        directory = os.path.join(periodic_root, container_id)
        if os.path.islink(directory) or not os.path.isdir(directory):
            continue
        names = _checkpoint_names(directory)
        for name in names:
            protected = container_id in recorded_ids and name == names[-1]
            found.append((name, container_id, _checkpoint_bytes(directory, name), not protected))
    total = sum(size for _, _, size, _ in found)
    gone = []
    for name, container_id, size, removable in sorted(found):
        if total <= budget_bytes:
            break
        if removable:
            prune_named(os.path.join(periodic_root, container_id), name)
            total -= size
            gone.append(f"{container_id[:12]}/{name}")
    return gone


class Schedule:
    """Checked by the service's loop (`check`), with the records and the clock it is given. Paused while a
    preemption is pending, its clocks with it (the first checkpoint after is an interval after the reset); a
    container not running is skipped; the records of containers their engine no longer knows are dropped
    (checked every RECORD_CHECK_S, and before each periodic checkpoint), paused or not."""

    def __init__(self, config: ServiceConfig, operations: Operations,
                 utilization: Callable[[], dict[str, int]] = utilization_by_uuid) -> None:
        self.config, self.operations, self.utilization = config, operations, utilization
        self.last_checkpoint: dict[str, float] = {}  # monotonic: the last try, or when first seen
        self.last_outcome: dict[str, tuple[float, str]] = {}  # the last try's wall-clock time and outcome
        self.busy_at: dict[str, float] = {}  # when each container's GPUs last showed work
        self._running: threading.Thread | None = None
        self._checked_at = -RECORD_CHECK_S  # the first check looks at the records at once
        self.paused = ""  # why periodic checkpoints and idle reclaim wait ("": they do not)

    def check(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._running is not None and self._running.is_alive():
            return
        records = recorded()
        present = {record.id for record in records}
        for table in (self.last_checkpoint, self.busy_at, self.last_outcome):
            for gone in set(table) - present:
                del table[gone]
        sweep = bool(records) and now - self._checked_at >= RECORD_CHECK_S
        if sweep:
            self._checked_at = now
        if self.paused:  # the clocks wait too: the first checkpoint (or idle suspend) comes an interval after it
            for record in records:
                self.last_checkpoint[record.id] = now
            self.busy_at.clear()
        due = [] if self.paused else [
            record for record in records if (interval := checkpoint_interval_s(record, self.config))
            and now - self.last_checkpoint.setdefault(record.id, now) >= interval]
        idle = [] if self.paused else self._idle(records, now)
        if due or idle or sweep:
            self._running = threading.Thread(target=self._act, args=(records if sweep else [], due, idle, now),
                                             name="schedule", daemon=True)
            self._running.start()

    def view(self, now: float | None = None) -> Periodic:
        """The schedule as `gpuckpt service status` shows it: each recorded container's interval, last and next."""
        now = time.monotonic() if now is None else now
        wall = time.time()
        scheduled = []
        for record in recorded():
            interval = checkpoint_interval_s(record, self.config)
            last = self.last_outcome.get(record.id)
            since = self.last_checkpoint.get(record.id)
            next_at = utc_at(wall + max(0.0, since + interval - now)) if interval and since is not None else None
            scheduled.append(Scheduled(id=record.id, engine=record.engine,
                                       every_min=round(interval / 60.0, 3) if interval else None,
                                       last_at=utc_at(last[0]) if last else None, last=last[1] if last else "",
                                       next_at=next_at))
        return Periodic(every_min=self.config.checkpoint_every_min, paused=self.paused, containers=scheduled)

    def _idle(self, records: list[ContainerRecord], now: float) -> list[ContainerRecord]:
        watched = [record for record in records if record.minutes("idle-suspend-after") and record.gpus]
        if not watched:
            return []
        try:
            utilization = self.utilization()
        except GpuckptError as error:
            log(f"idle reclaim: cannot read GPU utilization: {error}")
            return []
        idle = []
        for record in watched:
            after = max(record.minutes("idle-suspend-after") or 0, self.config.idle_min_minutes) * 60.0
            if any(utilization.get(gpu.uuid, 100) > 0 for gpu in record.gpus):
                self.busy_at[record.id] = now
            elif now - self.busy_at.setdefault(record.id, now) >= after and read_suspension(record.id) is None:
                idle.append(record)
        return idle

    def _act(self, checked: list[ContainerRecord], due: list[ContainerRecord], idle: list[ContainerRecord],
             now: float) -> None:
        gone = self._drop_removed({record.id: record for record in [*checked, *idle]}.values())
        groups_done: set[str] = set()
        for record in due:
            if record.id in gone:
                continue
            if record.engine in through_engine.DRAINED_ENGINES and not through_engine.is_running(record):
                if not self._drop_removed([record]):  # stopped, or drained and not restored: nothing to take
                    self.last_checkpoint[record.id] = now
                    self.last_outcome[record.id] = (time.time(), "skipped: not running")
                continue
            if name := through_engine.group_of(record):  # a rank is never checkpointed alone: its group is
                if name not in groups_done:
                    groups_done.add(name)
                    self._periodic_group(name, now)
                continue
            self._periodic(record, now)
        for record in idle:
            if record.id in gone:
                continue
            try:
                through_engine.suspend(record)
            except GpuckptError as error:
                log(f"idle reclaim: suspend failed: {error}", **facts(record, "suspend"))
                continue
            self.busy_at[record.id] = now  # counts again from its resume
            log("idle reclaim: suspended, its GPUs are free (gpuckpt resume gives them back)",
                **facts(record, "suspend"))

    def _drop_removed(self, records: Iterable[ContainerRecord]) -> set[str]:
        """The records whose engine no longer knows their container removed (podman runs no poststop hook for a
        container it restored, so `podman rm` of one leaves its record); the IDs of those not there. Removed
        only while no drain or restore runs (a container they take out and bring back is briefly unknown to
        its engine), and asked again then: the lock is held only where something is to go."""
        missing = [record for record in records if not through_engine.exists(record.engine, record.id)]

        def drop() -> None:
            for record in missing:
                if not through_engine.exists(record.engine, record.id) and remove_record(record.id, record.bundle):
                    log(f"the container no longer exists: its record removed ({record.engine} container "
                        f"{short_id(record.id)})", **facts(record, "periodic"))
        if missing:
            with contextlib.suppress(GpuckptError):  # an operation under way: looked at again next time
                self.operations.exclusive_call("record check", drop)
        return {record.id for record in missing}

    def _periodic_group(self, name: str, now: float) -> None:
        """A group's periodic checkpoint: every member at once, left running (gpuckpt checkpoint --group
        --leave-running), in podman's own store (the latest one each; not kept as archives); one outcome for all."""
        members = [record for record in recorded() if through_engine.group_of(record) == name]
        tried_at = time.time()
        for record in members:
            self.last_checkpoint[record.id] = now
        began = time.monotonic()
        try:
            checkpointed = self.operations.exclusive_call(
                "periodic checkpoint", lambda: through_engine.checkpoint_group(name, leave_running=True))
        except GpuckptError as error:
            outcome = f"failed: group {name}: {error}"
            log(f"periodic checkpoint of group {name} failed: {error}")
        else:
            outcome = f"group {name}: {len(checkpointed)} member(s) in podman's store"
            log(f"periodic checkpoint of group {name}: {len(checkpointed)} member(s)",
                BYTES=sum(size for _, size in checkpointed.values()), SECONDS=round(time.monotonic() - began, 3))
        for record in members:
            self.last_outcome[record.id] = (tried_at, outcome)

    def _periodic(self, record: ContainerRecord, now: float) -> None:
        directory = os.path.join(self.config.archive_dir, PERIODIC_DIR, record.id)
        os.close(private_directory(self.config.archive_dir))  # nobody else may move what is below it
        for fd in make_directories(directory, 0o700)[:2]:
            os.close(fd)
        tried_at = time.time()
        name = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(tried_at))
        self.last_checkpoint[record.id] = now  # tried, whatever comes of it: the next try is an interval away
        began = time.monotonic()
        try:
            where, size = self.operations.exclusive_call(
                "periodic checkpoint", lambda: through_engine.checkpoint_live(record, directory, name))
        except GpuckptError as error:
            self.last_outcome[record.id] = (tried_at, f"failed: {error}")
            log(f"periodic checkpoint of {_label(record)} failed: {error}", **facts(record, "periodic"))
            return
        self.last_outcome[record.id] = (tried_at, where)
        gone = prune(directory, self.config.checkpoint_keep)
        gone += prune_to_budget(os.path.join(self.config.archive_dir, PERIODIC_DIR),
                                int(self.config.checkpoint_budget_gib * 2**30), {item.id for item in recorded()})
        removed = f"; removed the older {', '.join(gone)}" if gone else ""
        log(f"periodic checkpoint {where}: {_label(record)}{removed}",
            **facts(record, "periodic"), BYTES=size, SECONDS=round(time.monotonic() - began, 3))


def _label(record: ContainerRecord) -> str:
    """The container as the drain's lines name it (operations.label): engine, name and short ID."""
    return f"{record.engine} container {container_label(through_engine.name(record.engine, record.id), record.id)}"
