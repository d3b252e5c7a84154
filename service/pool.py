"""gpuckptd's warm pool: standbys restored ahead of time, handed out on request (docs/standby.md).

For each checkpoint the config names (`pool.standbys`: a stored checkpoint's name or an archive's path ->
N), keep N standbys: containers restored with `gpuckpt restore --standby`, their CUDA processes' GPU
state in host memory. Each service tick (`check`): standbys whose container is gone are forgotten,
those whose checkpoint was removed or no longer verifies (the archive's signature, the trust policy,
the file changed since) are removed, then the missing ones are restored on a thread of their own while
the node's budget (`pool.host_budget_bytes`) has room. `take` hands out the oldest standby of a
checkpoint, resumed onto its GPUs, and starts the next restore. One record per standby
(state_dir/pool/NAME.json, a pydantic model) keeps the pool across a gpuckptd restart; a reboot ends the
standbys' processes and, on tmpfs, their records with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import GpuckptError, ImageError
from ..host import process
from ..host.procfs import descendants, resident_bytes
from ..host.safefiles import read_bounded, replace_file
from ..node.config import PoolConfig
from ..node.paths import state_dir
from ..node.suspension import read_suspension, remove_suspension
from ..oci.problems import first_problem
from ..oci.timestamps import utc_now
from ..store.repository import Store
from ..trust.keys import load_trust
from ..trust.provenance import signature_path, verify_archive_signature
from .api import CONTAINER_ID_PATTERN, PoolEntry, PoolState
from .systemd import log
from .through_engine import ENGINE_TIMEOUT_S, _gpuckpt

SCHEMA_VERSION = 1
NAME_PREFIX = "gpuckpt-pool-"  # the standbys' container names: the pool removes only containers it named
MAX_RECORD_BYTES = 64 << 10
SWEEP_EVERY_S = 30.0  # the tick is 1 s; each sweep asks podman about every standby and reads the signatures


class PoolStandby(BaseModel):
    """state_dir/pool/CONTAINER.json: one standby the pool restored and has not handed out."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int = SCHEMA_VERSION
    container: str = Field(pattern=CONTAINER_ID_PATTERN)  # the name the pool gave it
    container_id: str = Field(pattern=CONTAINER_ID_PATTERN)
    checkpoint: str  # as the config names it
    fingerprint: str  # the checkpoint as it was restored (checkpoint_fingerprint)
    host_bytes: int = Field(ge=0)  # what its processes held once restored
    created: str


class CheckpointGone(GpuckptError):
    """The checkpoint a standby came from is no longer there."""


class StandbyEngine(Protocol):
    """Where standbys are made, resumed and removed: podman through the CLI (PodmanStandbys)."""

    def restore(self, checkpoint: str, name: str, store_dir: str) -> str: ...  # the new container's ID

    def host_bytes(self, container_id: str) -> int: ...

    def resume(self, container_id: str) -> None: ...

    def remove(self, container_id: str) -> None: ...

    def exists(self, container_id: str) -> bool: ...


class PodmanStandbys:
    """Standbys as podman containers: `gpuckpt restore --standby` and `gpuckpt resume`, each a program of its
    own (its cuInit, its failure, its one line)."""

    def restore(self, checkpoint: str, name: str, store_dir: str) -> str:
        # the pool's checkpoints are the operator's (its config): their container config ran on a node it trusts
        process.run([_gpuckpt(), "restore", "--standby", "--trust-config", "--name", name, "--store", store_dir,
                     checkpoint], timeout_s=ENGINE_TIMEOUT_S)
        return process.run(["podman", "inspect", "--format", "{{.Id}}", name], timeout_s=60).stdout.strip()

    def host_bytes(self, container_id: str) -> int:
        record = read_suspension(container_id)
        if record is not None:
            return record.host_bytes
        pid = process.run(["podman", "inspect", "--format", "{{.State.Pid}}", container_id], timeout_s=60).stdout
        return resident_bytes(descendants(int(pid.strip()))) if pid.strip().isdigit() else 0

    def resume(self, container_id: str) -> None:
        if read_suspension(container_id) is not None:  # a checkpoint without CUDA processes restores running
            process.run([_gpuckpt(), "resume", "--engine", "podman", container_id], timeout_s=ENGINE_TIMEOUT_S)

    def remove(self, container_id: str) -> None:
        process.run(["podman", "rm", "-f", container_id], timeout_s=300, check=False)
        remove_suspension(container_id)

    def exists(self, container_id: str) -> bool:
        return process.run(["podman", "container", "exists", container_id], timeout_s=60,
                           check=False).returncode == 0


def is_archive(checkpoint: str) -> bool:
    return checkpoint.startswith("/")  # node/config.py: a store name has no '/'


def checkpoint_fingerprint(checkpoint: str, store_dir: str) -> str:
    """What the checkpoint is now, checked: an archive verified by the trust policy (its signature opened with
    a trusted key, or an unsigned exception) and named by the file's identity and its signature's digest; a
    stored checkpoint by the digest of its manifest (every chunk named by its hash). CheckpointGone if it is
    not there; SignatureError if it no longer verifies."""
    if is_archive(checkpoint):
        try:
            found = os.stat(checkpoint)
        except FileNotFoundError:
            raise CheckpointGone(f"{checkpoint}: no such archive") from None
        verify_archive_signature(checkpoint, load_trust())  # the envelope and its key; content: the identity below
        sig = signature_path(checkpoint)
        signed = hashlib.sha256(read_bounded(sig, 1 << 20, sig)).hexdigest() if os.path.lexists(sig) else "unsigned"
        return f"archive {found.st_dev}:{found.st_ino}:{found.st_size}:{found.st_mtime_ns} sig {signed}"
    with Store(store_dir) as store:
        if not store.has_checkpoint(checkpoint):
            raise CheckpointGone(f"stored checkpoint {checkpoint}: not in {store_dir}")
        stored = store.read_checkpoint(checkpoint)
    return f"stored {hashlib.sha256(stored.model_dump_json().encode()).hexdigest()}"


def checkpoint_bytes(checkpoint: str, store_dir: str) -> int:
    """A first guess of a standby's host memory before any was restored: the checkpoint's size."""
    if is_archive(checkpoint):
        return os.stat(checkpoint).st_size
    with Store(store_dir) as store:
        return store.read_checkpoint(checkpoint).logical_bytes


class Pool:
    def __init__(self, config: PoolConfig, engine: StandbyEngine | None = None,
                 say: Callable[[str], None] = log, name_prefix: str = NAME_PREFIX, directory: str = "") -> None:
        self.config, self.engine, self.say = config, engine or PodmanStandbys(), say
        self.name_prefix = name_prefix
        self.directory = directory or os.path.join(state_dir(), "pool")  # the records
        self._lock = threading.Lock()  # the records, and which fill runs
        self._filling: threading.Thread | None = None
        self._swept_at: float | None = None
        self.paused = False  # set while a preemption's drain runs: nothing new is restored

    # -- records -----------------------------------------------------------------------------------

    def _path(self, container: str) -> str:
        return os.path.join(self.directory, f"{container}.json")

    def records(self) -> list[PoolStandby]:
        """The standbys on record, oldest first; an unreadable record is named and left out."""
        try:
            names = sorted(name for name in os.listdir(self.directory) if name.endswith(".json"))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                found.append(PoolStandby.model_validate_json(read_bounded(path, MAX_RECORD_BYTES, path)))
            except ValidationError as error:
                self.say(f"pool: {path}: not a standby record: {first_problem(error)}")
            except (ImageError, FileNotFoundError):
                continue  # taken meanwhile
        return sorted(found, key=lambda record: (record.created, record.container))

    def _write(self, record: PoolStandby) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        replace_file(self._path(record.container), record.model_dump_json(indent=2))

    def _forget(self, record: PoolStandby) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(record.container))

    def held_bytes(self) -> int:
        return sum(record.host_bytes for record in self.records())

    # -- the tick -------------------------------------------------------------------------------------

    def check(self) -> None:
        """The service tick: every SWEEP_EVERY_S, sweep, then restore what is missing."""
        now = time.monotonic()
        if self._swept_at is not None and now - self._swept_at < SWEEP_EVERY_S:
            return
        self._swept_at = now
        if self.config.standbys or self.records():
            self.sweep()
            self.refill()

    def refill(self) -> None:
        """Restore what is missing on a thread of its own, one such thread at a time."""
        with self._lock:
            if self.paused or (self._filling is not None and self._filling.is_alive()):
                return
            if not self._short():
                return
            self._filling = threading.Thread(target=self._fill_reporting, name="pool-fill", daemon=True)
            self._filling.start()

    def _short(self) -> bool:
        have = self._counts()
        return any(have.get(checkpoint, 0) < wanted for checkpoint, wanted in self.config.standbys.items())

    def _counts(self) -> dict[str, int]:
        have: dict[str, int] = {}
        for record in self.records():
            have[record.checkpoint] = have.get(record.checkpoint, 0) + 1
        return have

    def _fill_reporting(self) -> None:
        try:
            for line in self.fill():
                self.say(line)
        except Exception as error:  # noqa: BLE001 -- a thread's edge: logged, the next tick tries again
            self.say(f"pool: internal error while restoring standbys: {type(error).__name__}: {error}")

    def sweep(self) -> list[str]:
        """Forget standbys whose container is gone; remove those whose checkpoint is gone, no longer verifies,
        or is no longer in the config. What was done, one line each (also said)."""
        lines = []
        fingerprints: dict[str, str | GpuckptError] = {}
        for record in self.records():
            if not self.engine.exists(record.container_id):
                self._forget(record)
                lines.append(f"pool: {record.container} is gone (removed outside the pool): forgotten")
                continue
            if record.checkpoint not in fingerprints:
                try:
                    fingerprints[record.checkpoint] = checkpoint_fingerprint(record.checkpoint,
                                                                             self.config.store_dir)
                except GpuckptError as error:  # SignatureError, CheckpointGone, an unreadable store
                    fingerprints[record.checkpoint] = error
            now = fingerprints[record.checkpoint]
            if isinstance(now, GpuckptError):
                why = str(now)
            elif now != record.fingerprint:
                why = f"{record.checkpoint} changed since the standby was restored from it"
            elif record.checkpoint not in self.config.standbys:
                why = f"{record.checkpoint} is no longer in pool.standbys"
            else:
                continue
            self.engine.remove(record.container_id)
            self._forget(record)
            lines.append(f"pool: {record.container} removed: {why}")
        for line in lines:
            self.say(line)
        return lines

    def fill(self) -> list[str]:
        """Restore standbys until each checkpoint has its N, in the config's order, while the budget has room;
        what was done or refused, one line each."""
        lines = []
        for checkpoint, wanted in self.config.standbys.items():
            while self._counts().get(checkpoint, 0) < wanted:
                line, made = self._restore_one(checkpoint)
                lines.append(line)
                if not made:
                    break
        return lines

    def _estimate(self, checkpoint: str) -> int:
        known = [record.host_bytes for record in self.records() if record.checkpoint == checkpoint]
        return max(known) if known else checkpoint_bytes(checkpoint, self.config.store_dir)

    def _restore_one(self, checkpoint: str) -> tuple[str, bool]:
        budget = self.config.host_budget_bytes
        try:
            fingerprint = checkpoint_fingerprint(checkpoint, self.config.store_dir)
            needed, held = self._estimate(checkpoint), self.held_bytes()
        except GpuckptError as error:
            return f"pool: no standby of {checkpoint}: {error}", False
        if held + needed > budget:
            return (f"pool: no standby more of {checkpoint}: it would hold ~{needed >> 20} MiB of host memory, "
                    f"{held >> 20} of the {budget >> 20} MiB of pool.host_budget_bytes are held"), False
        name = f"{self.name_prefix}{_short_name(checkpoint)}-{secrets.token_hex(4)}"
        started = time.monotonic()
        try:
            container_id = self.engine.restore(checkpoint, name, self.config.store_dir)
            host_bytes = self.engine.host_bytes(container_id)
        except GpuckptError as error:
            return f"pool: restoring a standby of {checkpoint} failed: {error}", False
        record = PoolStandby(container=name, container_id=container_id, checkpoint=checkpoint,
                             fingerprint=fingerprint, host_bytes=host_bytes, created=utc_now())
        if self.held_bytes() + host_bytes > budget:  # the guess was low: the budget holds all the same
            self.engine.remove(container_id)
            return (f"pool: the standby of {checkpoint} held {host_bytes >> 20} MiB, past pool.host_budget_bytes "
                    f"({budget >> 20} MiB, {self.held_bytes() >> 20} held): removed"), False
        self._write(record)
        return (f"pool: {name} restored in standby from {checkpoint} in {time.monotonic() - started:.1f} s, "
                f"holding {host_bytes >> 20} MiB of host memory"), True

    # -- requests -------------------------------------------------------------------------------------

    def take(self, checkpoint: str) -> tuple[PoolStandby, float]:
        """The oldest standby of `checkpoint`, resumed onto its GPUs and no longer the pool's; the seconds the
        resume took. The next one is restored in the background."""
        with self._lock:
            mine = [record for record in self.records() if record.checkpoint == checkpoint]
            if not mine:
                wanted = self.config.standbys.get(checkpoint)
                known = "not in pool.standbys" if wanted is None else f"none ready of the {wanted} configured"
                raise GpuckptError(f"pool: no standby of {checkpoint} to hand out ({known})")
            record = mine[0]
            self._forget(record)  # from here it is the caller's, whatever the resume does
        started = time.monotonic()
        try:
            self.engine.resume(record.container_id)
        except GpuckptError as error:
            raise GpuckptError(f"pool: {record.container} could not be resumed ({error}); it is left as it is, "
                               "no longer in the pool") from None
        finally:
            self.refill()
        return record, time.monotonic() - started

    def state(self) -> PoolState:
        records = self.records()
        return PoolState(standbys=[PoolEntry(container=r.container, checkpoint=r.checkpoint, host_bytes=r.host_bytes,
                                             created=r.created) for r in records],
                         wanted=dict(self.config.standbys), held_bytes=sum(r.host_bytes for r in records),
                         budget_bytes=self.config.host_budget_bytes)


def _short_name(checkpoint: str) -> str:
    """A container-name-safe piece of the checkpoint's name (an archive: its file name)."""
    base = os.path.basename(checkpoint).split(".")[0] if is_archive(checkpoint) else checkpoint
    cleaned = "".join(c if c.isalnum() or c in "_-" else "-" for c in base)[:40].strip("-")
    return cleaned or "checkpoint"
