"""`gpuckpt-runtime checkpoint`: the delegate's checkpoint, wrapped with the policy and GPU steps.

Phases, in order, as `Checkpoint` reads top to bottom: the plan (shim/checkpoint_plan.py:
argv, config, spec) refused where the operator does not allow it; the container's processes
read once (host/processes.py) and judged (policy/), driver files noted; CRIU's network options and config lines
added to the plan; the CUDA processes found and what the driver could not restore refused;
the manifest written marked incomplete (shim/checkpoint_manifest.py); lock and checkpoint
them (thawing a frozen container for that); the delegate's dump, which --leave-running holds frozen
until the link-remap names CRIU removed as it ended are put back (shim/link_remap.py) and /dev/shm is
copied into the image (transfer/devshm.py: podman's own copy comes later, of a later moment); with
--leave-running restore and unlock them; the manifest marked complete and signed. A lazy dump (--lazy-pages, CPU
containers only: shim/checkpoint_lazy.py) is marked "lazy, completing" and signed when its page
server is ready, before the engine hears of it. Each step that changes
something registers its undo as it is done (shim/rollback.py): until the dump succeeded, any
exception or a SIGTERM/SIGINT/SIGHUP (a flag, checked between phases) runs them; the
container keeps running and the engine gets one line. After it, a signal is noted and the
checkpoint completes.

One gpuckpt operation on a container at a time (node/journal.py's lock). Each phase is
written to the container's journal on disk before it starts; a shim killed outright
(SIGKILL) leaves it, and the next owned verb on the container finishes it first
(shim/recover.py).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import NoReturn

from ..cuda.driver import CudaDriver
from ..cuda.engine import CudaSession, one_line, refuse_stopped
from ..cuda.forked import split_forked_children
from ..cuda.group import GROUP_ENGINE
from ..cuda.hugepages import hugepages_always
from ..cuda.inventory import Inventory
from ..cuda.node import NodeGpus
from ..cuda.plugin import criu_cuda_plugin, disable_criu_plugins
from ..cuda.suspend import STANDBY_ENGINE, checkpointed_pids
from ..errors import CheckpointRefusedError, DelegateError, GpuCheckpointError, GpuckptError, ImageError
from ..host.processes import Processes, read_container
from ..host.procfs import resident_bytes
from ..host.safefiles import require_image_directory_private
from ..node.journal import Journal, Phase, boot_id, process_record, remove_journal, write_journal
from ..node.lock import ContainerLock, StateKey
from ..node.suspension import Suspension, read_suspension, remove_suspension
from ..oci.state import ContainerState
from ..policy.annotations import unrestorable_allowed
from ..policy.driver_files import driver_files_of
from ..policy.gpu import pre_dump_refusals, unrestorable_refusals
from ..policy.network import choose, container_policy, inspect_sockets, missing_option_hint
from ..policy.undumpable import undumpable_refusals
from ..transfer.devshm import NotCopied, copy_devshm
from .argv import (
    CHECKPOINT_VALUE_FLAGS,
    RuntimeArgs,
    VerbArgs,
    delegate_argv,
    image_dir_of,
    image_path_given,
)
from .checkpoint_lazy import LazyHandshake, lazy_dump, refuse_lazy_gpu
from .checkpoint_manifest import (
    begin_manifest,
    complete_manifest,
    lazy_dump_failed,
    lazy_manifest,
    write_checkpoint_manifest,
)
from .checkpoint_plan import plan_checkpoint
from .criu_log import criu_failure
from .criuconf import ghost_limit_of, link_remap_files, network_lock_lines, use_criu_config
from .delegate import (
    DelegateRun,
    PidsQuery,
    container_state,
    owned_call,
    run_delegate,
    verb_has_flag,
)
from .freezer import Freezer, thawed
from .interrupt import Interrupted, SignalFlag, deferred_signals
from .link_remap import put_back_link_remaps, remove_left_link_remaps
from .log import drop_held_stderr, log, release_stderr
from .pause import PAUSE_ENGINE
from .recover import finish_left_journal
from .rollback import Rollback
from .staging import make_staging_dir, move_staged, staged_argv, staging_refusal

ATTEMPTS = 2  # a checkpoint taken again once when a process took the driver during the first
DUMP_BASE_S = 300  # criu.dump_timeout_s = "auto": this, plus a second per DUMP_BYTES_PER_S the container holds
DUMP_BYTES_PER_S = 10 << 20
MAX_IMAGE_ENTRIES = 65536  # entries of an image directory looked at when a failed dump's images are removed


def _suspended_by(record: Suspension) -> str:
    """Who left the container's GPU state in host memory, for the user's line."""
    return {PAUSE_ENGINE: "the pause", STANDBY_ENGINE: "the standby restore",
            GROUP_ENGINE: "the group checkpoint"}.get(record.engine, "gpuckpt suspend")


class DriverTakenMeanwhile(DelegateError):
    """The dump failed after a process of the container began holding the GPU driver during the checkpoint
    (a compile pool starting its workers, say): CRIU cannot dump such a process unless the shim handled it,
    and the shim looked before it began. Rolled back completely; a new attempt sees it."""

    def __init__(self, message: str, exit_status: int, newcomers: list[int], cause: str) -> None:
        super().__init__(message, exit_status)
        self.newcomers, self.cause = newcomers, cause


def run(args: RuntimeArgs, delegate: str, gpus: NodeGpus | None = None) -> int:
    owned = owned_call(args, CHECKPOINT_VALUE_FLAGS)
    if owned is None:
        return run_delegate(delegate, args.argv)  # usage: the delegate's own answer
    verb, container_id = owned
    gpus = gpus or NodeGpus()
    key = StateKey.of(container_id, args.runtime_root(delegate))
    with ContainerLock(key, "checkpoint") as lock:
        finish_left_journal(key, delegate, gpus, lambda line: log(args, "warning", line))
        pids_query = PidsQuery(delegate, args.global_argv, container_id)  # runs beside the state query
        try:
            try:
                state = container_state(delegate, args.global_argv, container_id)
            except DelegateError:
                pids_query.close()  # ended before the delegate runs: no `ps` of ours beside its checkpoint
                return run_delegate(delegate, args.argv)  # no such container: runc's own error
            status = _attempts(args, verb, container_id, delegate, state=state, gpus=gpus, first_query=pids_query)
        finally:
            pids_query.close()
            remove_journal(key)  # done or rolled back, either way: nothing left to finish
        if status == 0 and not (verb.has("leave-running") or verb.has("pre-dump")):
            # The dump ended the container: the engine's delete that follows has nothing of ours to
            # remove, so the compiled launcher passes it through (shim/delete.py's one addition)
            with contextlib.suppress(OSError):
                lock.remove_file()
    release_stderr()  # no line of ours: the delegate's own words, as they were (an error raised: after ours)
    return status


def _attempts(args: RuntimeArgs, verb: VerbArgs, container_id: str, delegate: str, *, state: ContainerState,
              gpus: NodeGpus, first_query: PidsQuery) -> int:
    """The checkpoint, taken once more if a process began holding the GPU driver during the first attempt
    (rolled back completely by then): what the failed dump left in the image directory removed, CRIU's
    config as the shim found it, and the container's processes asked again."""
    image_dir = image_dir_of(verb)
    images_before = _image_files(image_dir)
    criu_config_env = os.environ.get("CRIU_CONFIG_FILE")
    query = first_query
    try:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return Checkpoint(args, verb, container_id, delegate=delegate, state=state, gpus=gpus,
                                  pids_query=query).run()
            except DriverTakenMeanwhile as error:
                if attempt == ATTEMPTS:
                    raise
                drop_held_stderr()  # the failed dump's words ("criu failed"): the line below says what happened
                log(args, "warning", f"{container_id}: the dump failed ({error.cause}) after process(es) "
                    f"{', '.join(map(str, error.newcomers))} began holding the GPU driver, once the shim had "
                    "looked; rolled back, the checkpoint is taken again")
                for name in _image_files(image_dir) - images_before:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(image_dir, name))
                if criu_config_env is None:
                    os.environ.pop("CRIU_CONFIG_FILE", None)
                else:
                    os.environ["CRIU_CONFIG_FILE"] = criu_config_env
                query = PidsQuery(delegate, args.global_argv, container_id)  # the processes now
    finally:
        if query is not first_query:
            query.close()
    raise AssertionError("every attempt returns or raises")


def _image_files(image_dir: str) -> set[str]:
    """The CRIU images (*.img) in `image_dir`, at most MAX_IMAGE_ENTRIES looked at."""
    try:
        with os.scandir(image_dir) as entries:
            return {entry.name for entry in itertools.islice(entries, MAX_IMAGE_ENTRIES) if entry.name.endswith(".img")}
    except OSError:
        return set()


class Checkpoint:
    """One checkpoint through the shim, from policy to manifest."""

    def __init__(self, args: RuntimeArgs, verb: VerbArgs, container_id: str, *, delegate: str, state: ContainerState,
                 gpus: NodeGpus, pids_query: PidsQuery) -> None:
        self.args, self.verb, self.delegate, self.state, self.gpus = args, verb, delegate, state, gpus
        self.pids_query = pids_query
        self.container_id = container_id
        self.plan = plan_checkpoint(args, verb, container_id, delegate, state)  # refused here if not allowed
        self.pid_in_container: dict[int, int] = {}  # the CUDA processes: host PID -> container PID
        self.processes = Processes(())  # read once, at the start of run (host/processes.py)
        self.forked_children: list[int] = []
        self.journal: Journal | None = None
        self.staging = ""  # --leave-running: the dump goes here first (shim/staging.py)

    def run(self) -> int:
        started = time.monotonic()
        if self.plan.lazy_pages and self.plan.gpu:
            refuse_lazy_gpu(self.container_id)  # before the processes are even read
        # Discover: the container's processes, read once; the policies below judge this snapshot.
        self.processes = read_container(self.pids_query.pids(), self.state.pid)
        for refusal in undumpable_refusals(self.container_id, self.processes):
            raise CheckpointRefusedError(refusal)
        # what a restore must give them again (policy/driver_files.py)
        self.plan = replace(self.plan, driver_files=driver_files_of(self.processes, self.plan.spec))
        self._choose_network_options()  # the plan completed: CRIU's options and config lines
        self._remove_left_link_remaps()
        # where the dump is signed: made here if runc would make it, so that nobody else makes it in between
        require_image_directory_private(image_path_given(self.verb), f"checkpoint of {self.container_id}", make=True)
        if work_path := self.plan.work_path:  # CRIU (root) writes its log and stats there, links followed
            require_image_directory_private(work_path, f"checkpoint of {self.container_id}: --work-path", make=True)
        if not self.plan.gpu:
            return self._dump_plain(started, gpu=False)  # no GPU: no driver, no extra step
        return self._run_gpu(started)

    def _choose_network_options(self) -> None:
        policy = container_policy(self.plan.config.criu, self.plan.annotations, self.container_id)
        found = inspect_sockets(self.state.pid, self.processes)
        network = choose(found, set(self.verb.flags), policy)
        if network.added_options:
            log(self.args, "info", f"{self.container_id}: added {' '.join(network.added_options)} "
                f"({len(found.tcp_connected)} connected TCP, {len(found.unix_external)} external unix "
                f"socket(s), {found.file_locks} file lock(s))")
        criu_config, criu_options = self._choose_criu_config()
        self.plan = replace(self.plan, network=network, criu_config=criu_config,
                            argv=delegate_argv(self.delegate, self.args, [*network.added_options, *criu_options]))

    def _choose_criu_config(self) -> tuple[list[str], list[str]]:
        """The shim's CRIU config lines (written, and kept for the manifest), and the delegate
        options that must carry one of them as well."""
        options: list[str] = []
        lines = network_lock_lines(self.plan.config.criu.network_lock)
        try:
            limit, why = ghost_limit_of(self.plan.config.criu.ghost_limit, self.processes,
                                        self.plan.config.criu.max_ghost_bytes)
        except CheckpointRefusedError as refusal:
            raise CheckpointRefusedError(f"checkpoint of {self.container_id} refused: {refusal}") from None
        if limit:
            lines.append(f"ghost-limit {limit}")
            if why:
                log(self.args, "info", f"{self.container_id}: CRIU ghost-limit {limit >> 20} MiB ({why})")
        if self.plan.config.criu.link_remap == "auto" and (linked := link_remap_files(self.processes)):
            lines.append("link-remap")  # runc 1.1 and crun leave it to CRIU's config files
            if verb_has_flag(self.delegate, "checkpoint", "link-remap"):
                options.append("--link-remap")  # runc >= 1.3 sends CRIU its own flag, over any config file's
            log(self.args, "info", f"{self.container_id}: CRIU link-remap for {len(linked)} file(s) held under a "
                f"removed name ({', '.join(sorted(linked)[:3])})")
        if lines:
            use_criu_config(lines)
        return lines, options

    def _uses_link_remap(self) -> bool:
        return "link-remap" in self.plan.criu_config or self.verb.has("link-remap")

    def _remove_left_link_remaps(self) -> None:
        """CRIU names its link-remap after the file's id, the same again on the next dump of the same processes:
        the names put back after an earlier leave-running dump would stop it."""
        if self._uses_link_remap() and (removed := remove_left_link_remaps(self.processes, self.state.pid)):
            log(self.args, "info", f"{self.container_id}: removed {', '.join(removed[:3])} (put back after an earlier "
                "dump left the container running) for CRIU's link-remap to make again")

    def _put_back_link_remaps(self) -> None:
        """--leave-running with link-remap: CRIU removed its link_remap names as the dump ended, and the engine
        copies /dev/shm into the checkpoint after we return; a restore needs them there (shim/link_remap.py)."""
        if not (self.plan.leave_running and self._uses_link_remap()):
            return
        try:  # not journaled: a shim killed here leaves at most a name the next dump removes
            remaps = put_back_link_remaps(self.staging or self.plan.image_dir, self.processes, self.state.pid)
        except ImageError as error:
            raise ImageError(f"checkpoint of {self.container_id} failed: {error}; the container keeps running, its "
                             "checkpoint would not restore and is left unsigned") from None
        if remaps:
            log(self.args, "info", f"{self.container_id}: put back CRIU's link-remap name(s) "
                f"{', '.join(remap.remap_name for remap in remaps[:3])} in the running container, which a restore "
                "of this checkpoint needs in the engine's copy of /dev/shm; they stay there until the container's "
                "next dump")

    def _run_gpu(self, started: float) -> int:
        for refusal in pre_dump_refusals(self.plan.pre_dump):
            raise GpuCheckpointError(refusal)

        paused = read_suspension(self.container_id)
        driver = self.gpus.load_driver()
        freezer = Freezer.of_process(self.state.pid)
        # The driver's state query waits while its process is frozen (docker pauses before a
        # checkpoint): the split asks it of every candidate, so it runs thawed too.
        with thawed(freezer):
            holding = self.gpus.find_cuda_pids(self.processes.pids)
            cuda_pids, self.forked_children = split_forked_children(driver, holding)
        plugin = criu_cuda_plugin()
        if plugin:
            # Exactly one of the two may handle the GPU: with the shim doing it, CRIU
            # must not also try (it would find the processes already checkpointed).
            disable_criu_plugins()
            log(self.args, "info", f"CRIU CUDA plugin {plugin} disabled for this dump; gpuckpt handles the GPU")
        if paused is not None:  # suspended (pause, gpuckpt suspend, a group, a standby): dumped as it is
            self._refuse_not_suspended(driver, paused, cuda_pids)
            self._release_forked_children(freezer)
            return self._dump_suspended(paused, started)
        if not cuda_pids:
            log(self.args, "info", f"{self.container_id}: GPU container without CUDA processes: plain dump")
            self._release_forked_children(freezer)
            return self._dump_plain(started, gpu=True)
        return self._checkpoint_gpu(driver, cuda_pids, freezer, started)

    def _dump_plain(self, started: float, gpu: bool) -> int:
        inventory = self.gpus.describe_container_gpus(self.plan.spec, []) if gpu else Inventory("", 0, [])
        self._begin_manifest(inventory, started, "the container keeps running")
        lazy = self.plan.lazy_pages
        if lazy:
            status = self._lazy_dump(inventory, started)
        else:
            with self._frozen_until_copied():
                status = self._finish_dump(self._start_dump())
                if status == 0:
                    self._at_the_dumps_moment()
        if status != 0:
            cause, hint = self._criu_cause(), self._failure_hint()
            if cause or hint:
                raise DelegateError(f"checkpoint of {self.container_id} failed ({os.path.basename(self.delegate)} "
                                    f"exited {status}{cause}){hint}", status)
            return status
        if lazy:
            self._put_back_link_remaps()
        self._complete_manifest(inventory, started, dump_s=time.monotonic() - started)
        return 0

    def _refuse_not_suspended(self, driver: CudaDriver, record: Suspension, cuda_pids: list[int]) -> None:
        """A suspension record is dumped as it is only if the driver holds every CUDA process checkpointed:
        a process it names that runs again, or one it does not name, would be dumped with its GPU state."""
        named = [process.pid for process in record.processes]
        running = sorted(set(cuda_pids) - set(checkpointed_pids(driver, cuda_pids)))
        if running:
            raise GpuCheckpointError(f"checkpoint of {self.container_id} refused: it is recorded as suspended "
                                     f"({_suspended_by(record)}) but CUDA process(es) {', '.join(map(str, running))} "
                                     "are not checkpointed; resume it (gpuckpt resume) and checkpoint it again")
        if missing := [pid for pid in named if not os.path.exists(f"/proc/{pid}")]:
            log(self.args, "info", f"{self.container_id}: suspended CUDA process(es) {', '.join(map(str, missing))} "
                "have exited")

    def _dump_suspended(self, record: Suspension, started: float) -> int:
        """The GPU state is in host memory already (a pause, gpuckpt suspend, a group checkpoint's lock, a
        standby restore): dump as it is."""
        cuda_pids = [process.pid for process in record.processes]
        inventory = self.gpus.describe_container_gpus(self.plan.spec, [])
        inventory.memory_bytes = {p.pid: p.device_bytes for p in record.processes}
        inventory.process_gpus = {p.pid: p.gpu_uuids for p in record.processes}
        self.pid_in_container = {pid: self.processes.container_pid(pid) for pid in cuda_pids}
        self._begin_manifest(inventory, started, f"its CUDA processes stay suspended as {_suspended_by(record)} "
                             "left them")
        dump_started = time.monotonic()
        with self._frozen_until_copied():
            status = self._finish_dump(self._start_dump())
            if status == 0:
                self._at_the_dumps_moment()
        if status != 0:
            raise DelegateError(f"checkpoint of {self.container_id} failed; its CUDA processes stay suspended "
                                f"as {_suspended_by(record)} left them{self._failure_hint()}", status)
        if not self.plan.leave_running:
            remove_suspension(self.container_id)  # the processes are gone; their image holds them
        self._complete_manifest(inventory, started, dump_s=time.monotonic() - dump_started)
        return 0

    def _checkpoint_gpu(self, driver: CudaDriver, cuda_pids: list[int], freezer: Freezer | None, started: float) -> int:
        inventory = self.gpus.describe_container_gpus(self.plan.spec, cuda_pids)
        self._refuse_unrestorable(cuda_pids, inventory)
        self.pid_in_container = {pid: self.processes.container_pid(pid) for pid in cuda_pids}  # read at the start
        session = CudaSession(driver, cuda_pids)
        rollback = Rollback()
        # The session remembers what its own calls did to each process: its undo resumes those alone.
        rollback.done("gpu", lambda: self._resume(session, freezer))
        with hugepages_always(self.plan.config.cuda.wants_hugepages), deferred_signals() as signals:
            return self._lock_checkpoint_dump(session, rollback, freezer, signals=signals, inventory=inventory,
                                              cuda_pids=cuda_pids, started=started)

    def _refuse_unrestorable(self, cuda_pids: list[int], inventory: Inventory) -> None:
        # NCCL's P2P paths exist only between GPUs: a job on one GPU has none.
        spans_gpus = len({uuid for pid in cuda_pids for uuid in inventory.process_gpus.get(pid, [])}) > 1

        allowed = unrestorable_allowed(self.plan.config.cuda, self.plan.annotations, self.container_id)
        reasons = {pid: self.gpus.unrestorable_reason(pid, spans_gpus) for pid in cuda_pids}
        for refusal in unrestorable_refusals(self.container_id, reasons, allowed):
            raise GpuCheckpointError(refusal)
        for reason in filter(None, reasons.values()):
            log(self.args, "warning", f"{reason} (allowed by the operator)")

    def _lock_checkpoint_dump(self, session: CudaSession, rollback: Rollback, freezer: Freezer | None, *,
                              signals: SignalFlag, inventory: Inventory, cuda_pids: list[int], started: float) -> int:
        """Lock and checkpoint the CUDA processes, dump; with --leave-running put them back. Until the dump
        succeeded, any exception rolls back every step `rollback` was told of."""
        first_lock = time.monotonic()
        try:
            # Before anything is locked: an image whose dump never completes is refused at restore.
            write_checkpoint_manifest(self.plan, inventory, self.pid_in_container, started, dump_s=0.0,
                                      completed=False)
            with thawed(freezer) as was_frozen:  # a frozen process cannot be locked (docker pauses first)
                if was_frozen:
                    log(self.args, "info", f"{self.container_id}: frozen by the engine: thawed for the GPU "
                        "lock and checkpoint, frozen again before the dump")
                session.require_running()
                refuse_stopped(session.pids)
                self._release_forked_children(freezer)
                signals.check()
                records = [process_record(pid, self.pid_in_container[pid]) for pid in cuda_pids]
                self._journal("gpu_checkpoint", gpu=True,
                              processes=[record for record in records if record is not None])
                session.lock(self.plan.config.cuda.lock_timeout_ms)
                signals.check()
                session.checkpoint()
            signals.check()
            if self._choose_staging():
                rollback.done("staging", self._drop_staging)
            with self._frozen_until_copied():
                dump_s = self._dump(signals)
                self._at_the_dumps_moment()
        except BaseException as error:  # noqa: BLE001 -- whatever it was: undone by the journal, raised as one line
            newcomers = self._new_driver_holders(cuda_pids) if isinstance(error, DelegateError) else []
            self._roll_back(rollback, error, newcomers, signals)
        if signals.signum is not None:  # the dump had succeeded: the container's state is in the image
            log(self.args, "warning", f"{self.container_id}: {signals.name} arrived during the dump, which completed: "
                "the checkpoint is completed")
        downtime_s = None
        if self.plan.leave_running:
            try:
                self._journal("gpu_resume")
                with thawed(freezer):
                    session.restore()
                    session.unlock()
            except BaseException as error:  # noqa: BLE001 -- as above: _roll_back raises
                self._roll_back(rollback, error)
            rollback.forget()  # the processes run again: what follows fails without undoing the checkpoint
            downtime_s = time.monotonic() - first_lock
            timed = {**session.timings, "dump_s": dump_s}
            phases = ", ".join(f"{name} {seconds:.3f}" for name, seconds in timed.items())
            where = "into memory" if self.staging else "into the image directory"
            log(self.args, "info", f"{self.container_id}: GPU downtime {downtime_s:.3f} s ({len(cuda_pids)} CUDA "
                f"process(es); dump {where}): {phases}")
            self._move_staged()
        self._complete_manifest(inventory, started, dump_s=dump_s, downtime_s=downtime_s, timings=session.timings)
        return 0

    @contextlib.contextmanager
    def _frozen_until_copied(self) -> Iterator[None]:
        """--leave-running: the container frozen from before the dump until _at_the_dumps_moment is done (CRIU
        leaves a cgroup frozen that it found frozen); thawed after, unless the engine had frozen it."""
        freezer = Freezer.of_process(self.state.pid) if self.plan.leave_running else None
        if freezer is None or self.plan.frozen_by_engine or freezer.is_frozen():
            yield
            return
        freezer.set_frozen(True)
        try:
            yield
        finally:
            freezer.set_frozen(False)

    def _at_the_dumps_moment(self) -> None:
        """--leave-running, the processes still frozen as dumped: CRIU's link-remap names back, then /dev/shm copied
        into the image, which an import restores instead of the engine's later copy (transfer/devshm.py)."""
        if not self.plan.leave_running:
            return
        self._put_back_link_remaps()
        try:
            files, size = copy_devshm(self.state.pid, self.plan.image_dir)
        except NotCopied as why:
            log(self.args, "warning", f"{self.container_id}: /dev/shm not copied at the dump ({why}): an import "
                "restores the engine's copy, made after the processes ran on")
            return
        log(self.args, "info", f"{self.container_id}: /dev/shm copied at the dump ({files} file(s), {size} bytes)")

    def _release_forked_children(self, freezer: Freezer | None) -> None:
        """Forked children (DataLoader workers) let go of the driver they inherited, so CRIU can dump
        them; before any lock, so a failure leaves everything running."""
        if not self.forked_children:
            return
        with thawed(freezer):  # ptrace cannot stop a frozen process (docker pauses first)
            holds = self.gpus.release_forked_children(self.forked_children)
        log(self.args, "info", f"{self.container_id}: {len(holds)} forked child(ren) of CUDA processes let go of "
            f"the GPU driver they inherited ({sum(len(h.fds) for h in holds)} descriptor(s), "
            f"{sum(len(h.mappings) for h in holds)} mapping(s)): pids {', '.join(str(h.pid) for h in holds)}")

    def _choose_staging(self) -> bool:
        """With --leave-running, the dump goes to memory first if it fits (shim/staging.py); whether it does."""
        if not (self.plan.leave_running and self.plan.config.cuda.stage_leave_running):
            return False
        if why := staging_refusal(self.processes.pids):  # read now: the device memory just moved to the host counts
            log(self.args, "info", f"{self.container_id}: dump not staged in memory: {why}")
            return False
        self.staging = make_staging_dir()
        return True

    def _drop_staging(self) -> list[str]:
        if self.staging:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = ""
        return []

    def _dump(self, signals: SignalFlag) -> float:
        """The delegate's dump (our signals go to it meanwhile); its seconds."""
        dump_started = time.monotonic()
        dump = self._start_dump()
        dump_status = self._finish_dump(dump)
        signals.note(dump.interrupted_by)
        if dump_status != 0 and dump.interrupted_by is not None:
            raise Interrupted(dump.interrupted_by)
        if dump_status != 0:
            delegate, cause = os.path.basename(self.delegate), self._criu_cause()
            raise DelegateError(f"{delegate} checkpoint exited {dump_status}{cause}", dump_status)
        return time.monotonic() - dump_started

    def _lazy_dump(self, inventory: Inventory, started: float) -> int:
        """--lazy-pages: the dump with the shim between the delegate's --status-fd and the engine's
        (shim/checkpoint_lazy.py); its exit status, once the pages were taken or it failed."""
        handshake = LazyHandshake(self.verb)

        def page_server_ready() -> None:
            if not lazy_manifest(self.plan, inventory, started):
                log(self.args, "warning", f"{self.container_id}: lazy checkpoint not signed: this node has no key "
                    "(gpuckpt install makes one); a restore of it needs the trust policy's restore:any")
            log(self.args, "info", f"{self.container_id}: lazy dump ready, its pages served by CRIU's page server")

        status = lazy_dump(self._start_dump(handshake), handshake, page_server_ready, self._finish_dump)
        if status != 0 and handshake.ready:
            lazy_dump_failed(self.plan, inventory, started)
        return status

    def _start_dump(self, handshake: LazyHandshake | None = None) -> DelegateRun:
        """The delegate's dump, started, with the journal naming it (a dump goes on if we are killed)."""
        self._journal("dump", dump_began=time.time(), staging_dir=self.staging)
        argv = self.plan.argv
        if self.staging:
            argv = staged_argv(self.plan.argv, self.args.command_index or 0, self.staging, self.plan.image_dir,
                               self.plan.work_path)
        if handshake is not None:
            argv = handshake.argv(argv, self.args.command_index or 0)
        dump = DelegateRun(self.delegate, argv, hold_stderr=True, reap=True)
        dump.start()
        if (child := dump.pid) is not None and (record := process_record(child, 0)) is not None:
            self._journal("dump", delegate_pid=child, delegate_start_time=record.start_time)
        return dump

    def _finish_dump(self, dump: DelegateRun) -> int:
        """The dump's end, bounded: where CRIU waits for a peer by criu.peer_timeout_s, else by criu.dump_timeout_s
        (from the memory it has to write); a dump ended by a signal or its bound leaves no criu behind
        (DelegateRun reaps it) and no freezer of CRIU's frozen."""
        criu = self.plan.config.criu
        peer = next((f"--{flag}" for flag in ("page-server", "lazy-pages") if self.verb.has(flag)), "")
        if peer:
            timeout_s, why = criu.peer_timeout_s, f"its peer ({peer}) did not complete it within {{}} s " \
                                                  "(criu.peer_timeout_s)"
        elif criu.dump_timeout_s == "auto":
            held = resident_bytes(self.processes.pids)  # now: device memory moved to the host counts
            timeout_s = DUMP_BASE_S + held // DUMP_BYTES_PER_S
            why = (f"it did not end within {{}} s (criu.dump_timeout_s \"auto\": {DUMP_BASE_S} s and 1 s per "
                   f"{DUMP_BYTES_PER_S >> 20} MiB of the {held >> 20} MiB the container holds)")
        else:
            timeout_s, why = criu.dump_timeout_s, "it did not end within {} s (criu.dump_timeout_s)"
        status = dump.finish(timeout_s)
        if dump.interrupted_by is not None or dump.timed_out:
            self._thaw_left_frozen()
        if dump.timed_out:
            raise DelegateError(f"checkpoint of {self.container_id} failed: the dump was ended, "
                                f"{why.format(timeout_s)}; {os.path.basename(self.delegate)} and criu were "
                                "killed", 1)
        return status

    def _thaw_left_frozen(self) -> None:
        """CRIU freezes the container's cgroup for the dump and thaws it as it ends; a criu killed leaves it
        frozen: thawed, unless the engine had frozen it."""
        if self.plan.frozen_by_engine or (freezer := Freezer.of_process(self.state.pid)) is None:
            return
        with contextlib.suppress(OSError, GpuckptError):
            if freezer.is_frozen():
                freezer.set_frozen(False)

    def _move_staged(self) -> None:
        """The processes run again: the staged images go where the engine wants them."""
        if not self.staging:
            return
        self._journal("move_staged")
        started = time.monotonic()
        try:
            moved = move_staged(self.staging, self.plan.image_dir)
        except OSError as error:
            raise GpuCheckpointError(f"checkpoint of {self.container_id} failed: the dump staged in "
                                     f"{self.staging} could not be moved to {self.plan.image_dir} "
                                     f"({one_line(error)}) and was dropped; the container keeps running") from None
        log(self.args, "info", f"{self.container_id}: {moved >> 20} MiB dumped into memory, moved to "
            f"{self.plan.image_dir} in {time.monotonic() - started:.3f} s after the GPU ran again")
        self.staging = ""

    def _begin_manifest(self, inventory: Inventory, started: float, left: str) -> None:
        """Before the dump: the manifest marked incomplete (an image cut short is refused at restore)."""
        begin_manifest(self.plan, inventory, self.pid_in_container, started, left)
        self._journal("prepared")

    def _complete_manifest(self, inventory: Inventory, started: float, *, dump_s: float,
                           downtime_s: float | None = None, timings: dict[str, float] | None = None) -> None:
        """The dump succeeded: mark the manifest complete and sign it; nothing is left to roll back."""
        if not complete_manifest(self.plan, inventory, self.pid_in_container, started, dump_s=dump_s,
                                 downtime_s=downtime_s, timings=timings):
            log(self.args, "warning", f"{self.container_id}: checkpoint not signed: this node has no key (gpuckpt "
                "install makes one); a restore of it needs the trust policy's restore:any")

    def _resume(self, session: CudaSession, freezer: Freezer | None) -> list[str]:
        """The GPU step's undo: every process the session touched back to running (thawed: a frozen process
        cannot be resumed); what could not be, one line each."""
        leftovers: list[str] | None = None
        try:
            with thawed(freezer):
                leftovers = session.rollback()
        except (OSError, GpuckptError):
            pass  # the freezer failed (its cgroup gone?): the driver may resume the processes all the same
        return session.rollback() if leftovers is None else leftovers

    def _roll_back(self, rollback: Rollback, cause: BaseException, newcomers: Sequence[int] = (),
                   signals: SignalFlag | None = None) -> NoReturn:
        """Undo what the rollback journal names (signals stay deferred: it runs to its end), then one line;
        with `newcomers` (processes that took the driver meanwhile), everything resumed and no signal to stop
        on (one may arrive during the rollback), a DriverTakenMeanwhile."""
        leftovers = rollback.run()
        what = one_line(cause)
        if leftovers:
            raise GpuCheckpointError(f"checkpoint of {self.container_id} failed ({what}); "
                                     f"rollback could not resume {'; '.join(leftovers)}")
        status = getattr(cause, "exit_status", 1)
        message = (f"checkpoint of {self.container_id} failed ({what}); its CUDA processes were restored and "
                   f"unlocked and the container keeps running{self._failure_hint()}")
        if newcomers and (signals is None or signals.signum is None):
            raise DriverTakenMeanwhile(f"{message}; process(es) {', '.join(map(str, newcomers))} began holding the "
                                       "GPU driver during the checkpoint", status, list(newcomers), what)
        raise DelegateError(message, status)

    def _new_driver_holders(self, cuda_pids: list[int]) -> list[int]:
        """The container's processes holding the GPU driver now that neither held it when the shim looked (as
        CUDA processes) nor were made to let go of it (forked children): /proc's word, not CRIU's log's."""
        try:
            holding = self.gpus.find_cuda_pids(self.gpus.descendants(self.state.pid))
        except OSError:
            return []
        return sorted(set(holding) - set(cuda_pids) - set(self.forked_children))

    def _failure_hint(self) -> str:
        hint = missing_option_hint(self.plan.network, set(self.verb.flags))
        if not hint and self.plan.config.criu.link_remap == "never" and (linked := link_remap_files(self.processes)):
            hint = (f"{sorted(linked)[0]} is held under a removed name (a POSIX named semaphore): CRIU needs "
                    f"link-remap for it, which criu.link_remap = \"auto\" gives")
        return f"; {hint}" if hint else ""

    def _criu_cause(self) -> str:
        """CRIU's reason for this dump's failure, from its log ("" when it did not get that far)."""
        if self.journal is None:
            return ""
        return criu_failure(self.journal.work_dir, self.journal.dump_began)

    def _journal(self, phase: Phase, **changes: object) -> None:
        """Write the phase about to start (and what it needs known) before it starts."""
        if self.journal is None:
            self.journal = Journal(container=self.container_id, verb="checkpoint", phase=phase, boot_id=boot_id(),
                                   shim_pid=os.getpid(), global_argv=self.args.global_argv, delegate=self.delegate,
                                   root=self.args.runtime_root(self.delegate),
                                   image_dir=self.plan.image_dir, work_dir=self.plan.work_dir,
                                   leave_running=self.plan.leave_running, refreeze=self.plan.frozen_by_engine)
        self.journal = self.journal.model_copy(update={"phase": phase, **changes})
        write_journal(self.journal)
