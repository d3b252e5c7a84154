"""`gpuckpt-runtime restore`: the delegate's restore, then the GPU steps.

Phases, in order: verify the dump's signature before any of its files is parsed, read the
image's manifest (refusing an image whose dump never completed; a lazy dump still completing
only to a lazy restore, --lazy-pages), check CRIU's images against
the bundle, the driver files and version against the manifest's (policy/driver_files.py) and this
node against the manifest (before touching anything), the delegate's
restore, then find the restored CUDA processes and restore (remapped if the GPUs
changed) and unlock them in parallel. A standby restore (`gpuckpt restore --standby`, or the
annotation io.gpuckpt.restore=standby where the operator allows it) stops before the driver's
restore: the processes stay checkpointed, their GPU state in host memory, and a suspension
record names the GPUs `gpuckpt resume` gives them (cuda/suspend.py). If the GPU steps fail, or a SIGTERM/SIGINT/SIGHUP
arrives before the driver's restore begins (a flag, checked between phases), the
half-restored container is killed rather than left with its processes locked.

One gpuckpt operation on a container at a time (node/journal.py's lock, held until the
container runs). A GPU restore writes its phases to the container's journal before each
starts; a shim killed outright leaves it, and the next owned verb on the container (or
`gpuckpt recover`) finishes the restore (shim/recover.py).
"""

from __future__ import annotations

import functools
import os
import time

from ..cuda.compat import check_node, gpu_pairs
from ..cuda.devices import GpuInfo
from ..cuda.driver import CudaDriver, GpuPair, ProcessState
from ..cuda.engine import CudaSession, one_line, query_states
from ..cuda.hugepages import hugepages_always
from ..cuda.node import NodeGpus
from ..cuda.suspend import standby
from ..errors import DelegateError, GpuCheckpointError, ImageError, UnsafeNodeError
from ..host.background import OnThread
from ..host.conmon import conmon_storage_roots
from ..host.deferred_free import holder_argv, open_large_files
from ..host.netns import in_netns_of, loopback_up
from ..host.podman_state import podman_record
from ..host.process import CommandError, caller_pid, start_detached
from ..host.procfs import container_pid, container_processes
from ..host.safefiles import read_bounded, require_image_directory_private
from ..node.config import Config, load_config
from ..node.engines import own_hook_paths
from ..node.journal import (
    Journal,
    JournalProcess,
    Phase,
    boot_id,
    process_record,
    remove_journal,
    write_journal,
)
from ..node.lock import ContainerLock, StateKey
from ..node.paths import config_path
from ..node.suspension import take_standby_request
from ..oci.bundle_layout import in_containers_storage
from ..oci.manifest import MANIFEST_NAME, Manifest, SpecGrants, read_manifest, require_completed
from ..oci.spec import Device, Spec, read_annotations, read_spec
from ..policy.annotations import refuse_runtime_annotations, standby_asked
from ..policy.archive_import import unsigned_restore_refusals
from ..policy.crun import crun_restore_refusals
from ..policy.devices import device_refusals
from ..policy.driver_files import driver_change_refusal
from ..policy.image import check_restore
from ..policy.spec_grants import namespace_path_refusals, podman_own_dirs, widened
from ..transfer.devshm import dump_devshm
from ..transfer.root_files import apply_staged, replace_devshm
from ..transfer.staging import ClaimedImport, claim_staged
from ..trust.dump_signature import DUMP_SIGNATURE, dumped_here, verify_dump
from ..trust.keys import load_trust
from ..trust.signature import SignatureError
from .argv import (
    RESTORE_VALUE_FLAGS,
    RuntimeArgs,
    VerbArgs,
    delegate_argv,
    image_dir_of,
    image_path_given,
)
from .criu_log import RESTORE_LOG, criu_failure
from .criuconf import network_lock_lines, use_criu_config
from .delegate import (
    DelegateRun,
    container_pids,
    container_state,
    kill_container,
    owned_call,
    run_delegate,
)
from .devnodes import sync_nvidia_nodes
from .interrupt import SignalFlag, deferred_signals
from .log import log
from .recover import finish_left_journal

START_TIMEOUT_S = 600.0


def run(args: RuntimeArgs, delegate: str, gpus: NodeGpus | None = None) -> int:
    owned = owned_call(args, RESTORE_VALUE_FLAGS)
    if owned is None:
        return run_delegate(delegate, args.argv)  # usage: the delegate's own answer
    verb, container_id = owned
    gpus = gpus or NodeGpus()
    lock = ContainerLock(StateKey.of(container_id, args.runtime_root(delegate)), "restore")
    with lock:
        finish_left_journal(lock.key, delegate, gpus, lambda line: log(args, "warning", line))
        try:
            return _restore(args, delegate, verb, container_id, gpus=gpus, lock=lock)
        finally:
            remove_journal(lock.key)


def _restore(args: RuntimeArgs, delegate: str, verb: VerbArgs, container_id: str, *, gpus: NodeGpus,
             lock: ContainerLock) -> int:
    group_standby = take_standby_request(container_id)  # used up whatever follows: a failed restore asks again
    config = load_config()
    bundle = os.path.abspath(verb.value("bundle", "b") or ".")
    annotations = read_annotations(bundle)
    refuse_runtime_annotations(annotations, container_id, config.criu, config_path(), [bundle])
    standby_by_annotation = standby_asked(config.cuda, annotations, container_id, config_path())
    require_image_directory_private(image_path_given(verb), f"restore of {container_id}")  # read by name below
    if work_path := verb.value("work-path"):  # CRIU (root) writes its log there, links followed
        require_image_directory_private(work_path, f"restore of {container_id}: --work-path", make=True)
    if not any(os.path.lexists(os.path.join(image_dir_of(verb), name))
               for name in ("inventory.img", DUMP_SIGNATURE, MANIFEST_NAME)):
        # no dump here (CRIU reads inventory.img first, and restores nothing without it), nor any of ours:
        # nothing of the directory is read, the delegate says what is wrong in its own words
        return run_delegate(delegate, delegate_argv(delegate, args, []))
    if staged := claim_staged(image_dir_of(verb)):  # before the check of the pages' signed sizes
        log(args, "info", f"{container_id}: {len(staged.pages)} pages image(s) staged by gpuckpt import moved in")

    # CRIU and runc rebuild the processes from these files: only as this node's or a trusted node's shim wrote
    # them, checked before any of them is parsed (the manifest, CRIU's images)
    lazy = verb.has("lazy-pages")  # a lazy restore may take a lazy dump still completing: its pages come later
    verified, signed = verify_dump_or_say_unfinished(image_dir_of(verb), f"restore of {container_id}",
                                                     staged.vouched if staged else "", lazy=lazy)
    log(args, "debug" if signed else "warning", verified)
    manifest = read_manifest(image_dir_of(verb))
    if manifest is not None:
        require_completed(manifest, image_dir_of(verb), lazy_restore=lazy)
    if staged is None:  # a staged import's config was checked by `gpuckpt import`, or trusted there (--trust-config)
        refuse_what_the_spec_adds(image_dir_of(verb), manifest, bundle, container_id, signed=signed)
    refuse_crun_killing_the_node(delegate, container_id, image_dir_of(verb))
    # CRIU sets each process's credentials, seccomp and namespaces from the images, whatever the spec says
    check_restore(image_dir_of(verb), bundle, f"restore of {container_id}", unsigned=not signed)
    refuse_driver_change(manifest, bundle, gpus)
    if network_lock := network_lock_lines(config.criu.network_lock):
        use_criu_config(network_lock)  # CRIU locks the network while it restores TCP connections too
    again: list[str] = []
    if manifest is not None:
        # CRIU restores TCP connections, external unix sockets and locks only when asked again.
        again = [option for option in manifest.network.added_options if option.lstrip("-") not in verb.flags]

    # every check passed: the container's own files, inside its root only
    _apply_root_files(args, staged, bundle, container_id, image_dir_of(verb))
    argv = delegate_argv(delegate, args, again)
    # asked by the annotation, by `gpuckpt restore --standby` (the staged import), or by a group restore
    in_standby = group_standby or standby_by_annotation or bool(staged and staged.standby)
    if manifest is None or not manifest.processes:
        return _restore_without_gpu(args, delegate, verb, container_id, bundle=bundle, argv=argv, standby=in_standby)
    return GpuRestore(args, verb, container_id, delegate, config=config, manifest=manifest, argv=argv, gpus=gpus,
                      lock=lock, standby=in_standby).run()


def _apply_root_files(args: RuntimeArgs, staged: ClaimedImport | None, bundle: str, container_id: str,
                      image_dir: str) -> None:
    """The imported archive's changed and deleted files, /dev/shm and volumes (podman was not given them),
    made inside where the engine mounted each, no link followed out of it (transfer.root_files); /dev/shm
    from the dump's own copy where a leave-running dump made one (signed with the images, verified above),
    also in place of what podman's own restore unpacked there."""
    if staged is None:
        if dump_devshm(image_dir) and (replaced := replace_devshm(read_spec(bundle), bundle, image_dir,
                                                                  f"restore of {container_id}")):
            log(args, "info", f"{container_id}: {replaced}")
        return
    if staged.root_files:
        done = apply_staged(read_spec(bundle), bundle, staged, f"restore of {container_id}", image_dir)
        log(args, "info", f"{container_id}: the imported archive's files applied: {done}")


def _restore_without_gpu(args: RuntimeArgs, delegate: str, verb: VerbArgs, container_id: str, *, bundle: str,
                         argv: list[str], standby: bool = False) -> int:
    """The delegate's restore alone: no GPU state to bring back (a standby asked for is a full restore)."""
    if standby:
        log(args, "info", f"{container_id}: a standby restore of a checkpoint without CUDA processes is a full one")
    try:  # for the loopback after the restore; an unreadable spec is the delegate's to refuse, in its words
        spec: Spec | None = read_spec(bundle)
    except ImageError:
        spec = None
    began = time.time()
    status = run_delegate(delegate, argv)
    if status != 0:
        say_criu_cause(args, verb, container_id, began)
    if status == 0:
        free_images_later(args, delegate, verb, container_id)
    if spec and status == 0 and detached(verb):  # a foreground one returns at its end
        loopback_as_created(args, delegate, verb, container_id, spec)
    return status


def say_criu_cause(args: RuntimeArgs, verb: VerbArgs, container_id: str, began: float) -> None:
    """After a failed restore of the delegate's: CRIU's own reason, from its restore.log, as an error line in the
    runtime's log (where podman reads the runtime's errors): the delegate's own line ("criu failed: type RESTORE
    errno 0") names nothing an operator can act on."""
    if cause := criu_failure(verb.value("work-path") or image_dir_of(verb), began, RESTORE_LOG):
        log(args, "error", f"restore of {container_id} failed{cause}")


def verify_dump_or_say_unfinished(image_dir: str, what: str, vouched: str = "", *,
                                  lazy: bool = False) -> tuple[str, bool]:
    """verify_dump; a dump left unsigned because it never completed (a checkpoint that failed or was cut
    short signs nothing) is refused as that, which the user can act on, not as a stranger's image."""
    try:
        return verify_dump(image_dir, load_trust(), what, vouched)
    except SignatureError as refusal:
        if os.path.lexists(os.path.join(image_dir, DUMP_SIGNATURE)):
            raise
        try:
            written = read_manifest(image_dir)
        except ImageError:
            raise refusal from None
        if written is not None:
            # only picks the refusal's words: it refuses either way
            require_completed(written, image_dir, lazy_restore=lazy)
        raise


def free_images_later(args: RuntimeArgs, delegate: str, verb: VerbArgs, container_id: str,
                      init_pid: int | None = None) -> None:
    """The delegate has read the images: their large files kept open by a holder, so that the engine's
    removal of the checkpoint (podman's, before its restore returns) frees them after the restore, not
    in it (host/deferred_free.py); the holder ends with the container's init at the latest. A restore never
    fails for this."""
    fds = open_large_files(image_dir_of(verb))
    if not fds:
        return
    try:
        try:
            until = os.pidfd_open(init_pid or restored_pid(args, delegate, verb, container_id))
        except (OSError, DelegateError):
            return  # the container ended already (or cannot be found): the engine's removal frees the files
        try:
            start_detached(holder_argv(fds, until), [*fds, until])
        finally:
            os.close(until)
    except CommandError as error:
        log(args, "debug", f"{container_id}: the checkpoint's files are freed when the engine removes them: {error}")
    finally:
        for fd in fds:
            os.close(fd)


def loopback_as_created(args: RuntimeArgs, delegate: str, verb: VerbArgs, container_id: str, spec: Spec) -> None:
    """runc's create sets `lo` up in a network namespace it makes for the container; its restore leaves it down
    (CRIU gets an empty namespace), and a server on 127.0.0.1 is then unreachable (crun's restore sets it up).
    A namespace the container joins by path is its owner's to set up: left alone."""
    if not spec.own_network_namespace():
        return
    try:
        pid = restored_pid(args, delegate, verb, container_id)
        if in_netns_of(pid, loopback_up):
            log(args, "info", f"{container_id}: loopback set up in the restored network namespace, as at create")
    except Exception as error:  # noqa: BLE001 -- the restore succeeded: this step never turns it into a failure
        log(args, "warning", f"{container_id}: loopback of the restored network namespace left as it is: "
                             f"{one_line(error)}")


def detached(verb: VerbArgs) -> bool:
    return verb.has("detach") or verb.has("d")


def restored_pid(args: RuntimeArgs, delegate: str, verb: VerbArgs, container_id: str) -> int:
    """The restored container's init: from the pid file the engine asked for (runc writes it once a detached
    restore is done; a foreground one's may be an older run's), else the delegate's state."""
    if detached(verb) and (pid_file := verb.value("pid-file")):
        try:
            text = read_bounded(pid_file, 32, pid_file).strip()
        except ImageError:
            text = b""
        if text.isdigit() and 0 < int(text) < 1 << 22:  # the kernel's PID_MAX_LIMIT
            return int(text)
    return container_state(delegate, args.global_argv, container_id).pid


def refuse_what_the_spec_adds(image_dir: str, manifest: Manifest | None, bundle: str, container_id: str, *,
                              signed: bool) -> None:
    """The restore spec of a restore `gpuckpt import` did not stage: a dump from elsewhere gets only the devices an
    import allows; a signed one no more hooks, capabilities and devices than its checkpointed spec had."""
    foreign = not dumped_here(image_dir, load_trust())
    # an unsigned dump the trust policy lets in (restore:any): nothing vouches for what it records
    recorded = (manifest.spec_grants if manifest else None) if signed else SpecGrants()
    if not (foreign or recorded is not None):
        return  # a manifest of a gpuckpt before the record: judged as then
    spec = read_spec(bundle)  # once, for both judgements
    podmans = in_containers_storage(bundle)
    # where the container's own bind sources may be: podman's directories of it, as podman (not its config) says
    roots = conmon_storage_roots(caller_pid()) if podmans else None
    own_dirs = podman_own_dirs(bundle, roots, container_id) if podmans else ()
    # podman's own --import takes the spec from spec.dump; containerd's and docker's make theirs (a Kubernetes
    # hostNetwork pod's containers join the host's namespaces through its sandbox, as the kubelet asked). What
    # podman itself put there (the netns it made, its pod's infra) is in its database, not in config.dump: read
    # only for a namespace another process is in
    record = functools.cache(lambda: podman_record(roots.graph_root, roots.run_root, container_id) if roots else None)
    if podmans and (joined := namespace_path_refusals(spec, record)):
        raise ImageError(f"restore of {container_id}: its spec joins namespaces {', '.join(joined[:3])}: refused (the "
                         "spec comes from outside the checkpoint: an archive's spec.dump)")
    if foreign:
        refuse_foreign_devices(spec, container_id)
    if recorded is not None:
        refuse_widened_spec(recorded, spec, bundle, container_id, unsigned=not signed, own_dirs=own_dirs)
    if not signed:
        refuse_unsigned_spec(spec, container_id, own_dirs)


def refuse_unsigned_spec(spec: Spec, container_id: str, own_dirs: tuple[str, ...]) -> None:
    """An unsigned dump's spec came with it: held to what `gpuckpt import` holds an archive's spec.dump to
    (policy/archive_import.py unsigned_restore_refusals)."""
    if problems := unsigned_restore_refusals(spec, container_id, own_dirs):
        raise ImageError(f"restore of {container_id}: an unsigned checkpoint's spec asks for {'; '.join(problems[:3])}"
                         ": refused (restore archives with `gpuckpt import`, which checks them, or sign the dump)")


def refuse_foreign_devices(spec: Spec, container_id: str) -> None:
    """A dump from elsewhere (another node's, or unsigned) restores only with the devices an import allows: its
    bundle may be an archive's spec.dump as podman's own --import took it. This node's own dumps restore the
    container's own spec, whatever devices the operator gave it."""
    for refusal in device_refusals(spec, "the restore bundle's config.json"):
        raise ImageError(f"restore of {container_id}: a checkpoint not dumped on this node asks for {refusal}: "
                         "refused")


def refuse_widened_spec(recorded: SpecGrants, spec: Spec, bundle: str, container_id: str, *,
                        unsigned: bool = False, own_dirs: tuple[str, ...] = ()) -> None:
    """The restore spec grants no hook, capability, device node or rule (nor, in podman's bundle, bind mount) the
    signed checkpoint's spec did not (policy/spec_grants.py): podman's own restore of an archive takes its spec
    from spec.dump, unsigned."""
    # a podman bundle's spec was made from spec.dump, its mounts too: judged as well
    podmans = in_containers_storage(bundle)
    if problems := widened(recorded, spec, own_hook_paths(), hooks_only=unsigned,
                           container_id=container_id if podmans and recorded.binds else "", own_dirs=own_dirs):
        had = "an unsigned checkpoint restores no hooks but gpuckpt-hook" if unsigned else \
            "which the checkpointed container did not have"
        raise ImageError(f"restore of {container_id} refused: its spec grants {'; '.join(problems)}, {had} (the spec "
                         "comes from outside the signed checkpoint: an archive's spec.dump); restore archives with "
                         "`gpuckpt import`, which checks them")


def refuse_driver_change(manifest: Manifest | None, bundle: str, gpus: NodeGpus) -> None:
    """Before the delegate: the processes' driver files brought again, and (with GPU state to restore) the same
    driver loaded (policy/driver_files.py). An unreadable spec is the delegate's to refuse, in its words."""
    if manifest is None or not manifest.driver_files:
        return
    try:
        spec: Spec | None = read_spec(bundle)
    except ImageError:
        spec = None
    node_driver = gpus.driver_version_string() if manifest.processes else None
    if refusal := driver_change_refusal(manifest, spec, node_driver):
        raise GpuCheckpointError(refusal)


def refuse_crun_killing_the_node(delegate: str, container_id: str, image_dir: str) -> None:
    for refusal in crun_restore_refusals(delegate, container_id, image_dir):
        raise UnsafeNodeError(refusal)


class GpuRestore:
    """The GPU side of one restore: node check, the delegate's restore, then the CUDA processes back."""

    def __init__(self, args: RuntimeArgs, verb: VerbArgs, container_id: str, delegate: str, *, config: Config,
                 manifest: Manifest, argv: list[str], gpus: NodeGpus, lock: ContainerLock,
                 standby: bool = False) -> None:
        self.args, self.verb, self.delegate, self.manifest, self.argv = args, verb, delegate, manifest, argv
        self.config, self.gpus, self.lock = config, gpus, lock
        self.standby = standby  # leave the processes checkpointed: no driver restore, no unlock
        self.container_id = container_id
        self.detach = detached(verb)
        self.phases: dict[str, float] = {}
        self.init_pid: int | None = None  # the restored container's init, once the delegate restored it
        self.spec_devices: list[Device] = []
        self.spec = Spec()
        self.rootfs = ""
        # host PIDs are known once the delegate restored them (phase gpu_restore)
        wanted = [JournalProcess(host_pid=0, start_time=0, container_pid=record.container_pid)
                  for record in manifest.processes]
        self.journal = Journal(container=container_id, verb="restore", phase="restore", boot_id=boot_id(),
                               shim_pid=os.getpid(), global_argv=args.global_argv, delegate=self.delegate,
                               root=lock.key.root,
                               image_dir=image_dir_of(verb), gpu=True, processes=wanted)

    def _ended(self) -> None:
        """Nothing of the restore is left to finish: its journal goes, then its lock (the container runs, or was
        stopped; a checkpoint of it may come while a foreground delegate still waits on it)."""
        remove_journal(self.lock.key)
        self.lock.release()

    def _write_journal(self, phase: Phase, **changes: object) -> None:
        self.journal = self.journal.model_copy(update={"phase": phase, **changes})
        write_journal(self.journal)

    def _target_gpus(self) -> list[GpuInfo]:
        bundle = os.path.abspath(self.verb.value("bundle", "b") or ".")
        spec = self.spec = read_spec(bundle)
        self.spec_devices, self.rootfs = spec.linux.devices, spec.rootfs(bundle)
        node_gpus = self.gpus.list_gpus()
        target = self.gpus.container_gpus(spec, [], node_gpus)
        check_node(self.manifest, target, self.gpus.driver_version_string(), self.config.cuda.driver_version_policy)
        return target

    def run(self) -> int:
        with hugepages_always(self.config.cuda.wants_hugepages), deferred_signals() as signals:
            return self._run(signals)

    def _run(self, signals: SignalFlag) -> int:
        started = time.monotonic()
        driver = self.gpus.load_driver()
        # The controlling process must have initialised CUDA before a restore; cuInit takes
        # a while, so it runs beside the node check and the delegate's restore. A standby calls no restore.
        initialising = OnThread((lambda: None) if self.standby else driver.init, "cuda-init")
        target = self._target_gpus()
        pairs = gpu_pairs(self.manifest, target)
        self.phases["check_s"] = time.monotonic() - started
        if signals.signum is not None:
            raise GpuCheckpointError(f"restore of {self.container_id} interrupted by {signals.name} before the "
                                     "delegate's restore; nothing was restored")
        mark = time.monotonic()
        self._write_journal("restore", gpu_pairs=[(pair.old_uuid, pair.new_uuid) for pair in pairs])
        delegate_run, began = DelegateRun(self.delegate, self.argv), time.time()
        delegate_run.start()
        if (child := delegate_run.pid) is not None and (record := process_record(child, 0)) is not None:
            self._write_journal("restore", delegate_pid=child, delegate_start_time=record.start_time)
        if self.detach:
            status = delegate_run.finish()
            signals.note(delegate_run.interrupted_by)
            if status != 0:
                say_criu_cause(self.args, self.verb, self.container_id, began)
                return status  # the delegate reported why; nothing of ours to undo
        elif not self._wait_running(delegate_run):  # the container's own: signals go on to it as runc's do
            if (status := delegate_run.finish()) != 0:
                say_criu_cause(self.args, self.verb, self.container_id, began)
            return status
        self.phases["delegate_restore_s"] = time.monotonic() - mark
        loopback_as_created(self.args, self.delegate, self.verb, self.container_id, self.spec)
        try:
            signals.check()
            initialising.wait()
            signals.check()
            initialising.result()
            self._restore_gpu(driver, pairs, signals)
        except BaseException as error:  # noqa: BLE001 -- whatever it was, no container left locked
            kill_container(self.delegate, self.args.global_argv, self.container_id)
            self._ended()
            if not self.detach:
                delegate_run.finish()
            raise GpuCheckpointError(
                f"restore of {self.container_id} failed: {one_line(error)}; the container was stopped"
            ) from None
        self._ended()
        free_images_later(self.args, self.delegate, self.verb, self.container_id, self.init_pid)  # once they run
        if signals.signum is not None:
            log(self.args, "warning", f"{self.container_id}: {signals.name} arrived while the driver restored the "
                "CUDA processes: the restore completed")
        self.phases["total_s"] = time.monotonic() - started
        phases = ", ".join(f"{name} {seconds:.3f}" for name, seconds in self.phases.items())
        done = "restored into standby (GPU state left in host memory; gpuckpt resume)" if self.standby else "restored"
        log(self.args, "info", f"{self.container_id}: {done} {len(self.manifest.processes)} CUDA process(es): "
                               f"{phases}")
        return 0 if self.detach else delegate_run.finish()

    def _wait_running(self, delegate_run: DelegateRun) -> bool:
        """Foreground restore: wait until the container runs (or the delegate gave up)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if delegate_run.poll() is not None:
                return False
            try:
                if container_state(self.delegate, self.args.global_argv, self.container_id).status == "running":
                    return True
            except DelegateError:
                pass
            time.sleep(0.05)
        return False

    def _restore_gpu(self, driver: CudaDriver, pairs: list[GpuPair], signals: SignalFlag) -> None:
        wanted = {record.container_pid for record in self.manifest.processes}

        state = container_state(self.delegate, self.args.global_argv, self.container_id)
        self.init_pid = state.pid
        for change in sync_nvidia_nodes(state.pid, self.spec_devices, self.rootfs):
            log(self.args, "info", f"{self.container_id}: {change} (the restore spec's devices)")
        host_pids = container_processes(container_pids(self.delegate, self.args.global_argv, self.container_id),
                                        state.pid)
        found = sorted(pid for pid in host_pids if container_pid(pid) in wanted)
        if len(found) != len(wanted):
            seen = sorted(container_pid(pid) for pid in host_pids)
            raise GpuCheckpointError(f"found {len(found)} of the {len(wanted)} checkpointed CUDA processes "
                                     f"(container PIDs wanted {sorted(wanted)}, present {seen})")
        answers = query_states(driver, found)  # watched: GetState waits while a process is stopped
        for pid in found:
            process_state = answers[pid]
            if isinstance(process_state, BaseException):
                raise process_state
            if process_state != ProcessState.CHECKPOINTED:
                raise GpuCheckpointError(f"restored process {pid} is {process_state.name.lower()}, not checkpointed")
        signals.check()  # the last boundary: from here the restore runs to its end (or fails and is killed)
        if self.standby:  # the driver is not called: the processes hold no GPU until `gpuckpt resume`
            record = standby(self.container_id, state.pid, found, self.manifest, pairs)
            log(self.args, "info", f"{self.container_id}: standby holds {record.host_bytes / 2**30:.2f} GiB of host "
                f"memory; GPUs for its resume: {', '.join(new for _, new in record.gpu_pairs) or 'its own'}")
            return
        records = [process_record(pid, container_pid(pid)) for pid in found]
        self._write_journal("gpu_restore", processes=[record for record in records if record is not None])
        session = CudaSession(driver, found)
        session.restore(pairs)
        session.unlock()
        self.phases.update(session.timings)
