"""`gpuckpt doctor`: does this node have what checkpoint/restore needs?

A check is a function in CHECKS: it returns its ok line, raises CheckFailed or CheckWarned (with the fix),
raises CheckSkipped where a whole section does not apply and the operator should know (no GPU: the GPU
checks), or returns None where it cannot apply and nothing need be said (no docker, no systemd). One
ok/warn/FAIL/skip line per check (`--json`: cli/output.py's DoctorReport); exit status 1 if any failed (a
warning is what works but costs, or an exception the operator made: it fails nothing).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Sequence

from ..cuda.devices import loaded_module_version
from ..cuda.driver import load_driver, version_text
from ..errors import ConfigError, GpuckptError, ImageError
from ..host import process
from ..host.cgroup_v1 import crun_directory, hybrid_or_legacy, stale_hierarchy_for_crun
from ..host.programs import find_program
from ..node.config import load_config
from ..node.container_record import short_id
from ..node.containerd import CONTAINERD_CONFIG, HANDLER, SHIM_RUNTIME_TYPE, containerd_registration
from ..node.engines import (
    PODMAN_HOOKS_DIR,
    PODMAN_RUNTIME_NAMES,
    docker_registration,
    podman_registration,
    podman_runtimes,
    read_engine_file,
    stands_in,
)
from ..node.hook_entry import hook_beside
from ..node.hooks_d import PACKAGED_HOOKS_DIR, hooks_d_files
from ..node.inventory import inventory_dir, recorded_containers
from ..node.journal import left_journals
from ..node.paths import config_path
from ..oci.cdi import CDI_DIRS, spec_files
from ..oci.criu_images import criu_messages
from ..service import through_engine
from ..service.api import Request, Status
from ..service.client import request
from ..shim.delegate import delegate_version
from ..shim.resident.call import listener_refusal
from ..shim.resident.call import socket_path as resident_socket_path
from ..shim.resolve import resolve_delegate
from ..trust.keys import load_trust, node_key_path, policy_path
from .output import DoctorCheck, DoctorReport

MIN_CRIU_MAJOR = 4
SERVICE_UNIT = "gpuckptd.service"  # packaging/systemd/gpuckptd.service
SYSTEMD_RUN_DIR = "/run/systemd/system"  # exists when systemd is PID 1 (sd_booted)
# Unit file states that start the unit at boot (systemctl(1), is-enabled).
ENABLED_STATES = ("enabled", "enabled-runtime", "linked", "linked-runtime", "generated", "transient")
STATUS_TIMEOUT_S = 10.0
RESIDENT_UNIT = "gpuckpt-runtimed.socket"  # packaging/systemd/gpuckpt-runtimed.socket
# What each podman checkpoint or restore adds over runc's (medians, the larger of the two), from
# results/bench/owned_verbs.json (bench/owned_verbs.py, the 2-core CI VM): worked in-process where the helper is
# absent, and handed to gpuckpt-runtimed (tests/test_doctor.py holds these to that file)
IN_PROCESS_ADDED_MS = 700
RESIDENT_ADDED_MS = 100


class CheckFailed(Exception):
    """A failed check: the message says what is wrong, `fix` what to do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


class CheckSkipped(Exception):
    """A check (or a section of them) that does not apply to this node; the message says why."""


class CheckWarned(Exception):
    """A check that passes at a cost the node need not pay: the message says what it costs, `fix` how to stop."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("doctor", help="check this node for what checkpoint/restore needs")
    parser.add_argument("--containerd-config", default=CONTAINERD_CONFIG,
                        help=f"containerd's config file to check (default {CONTAINERD_CONFIG})")
    parser.add_argument("--json", action="store_true", help="the checks as JSON (docs/cli-output.md)")
    parser.set_defaults(handler=run)


def check_kernel() -> str:
    if not os.path.exists("/proc/sys/kernel/ns_last_pid"):
        raise CheckFailed("the kernel lacks CONFIG_CHECKPOINT_RESTORE", "boot a kernel built with "
                                                                        "CONFIG_CHECKPOINT_RESTORE=y")
    return "kernel has checkpoint/restore support"


# What an operator with only the package can do (docs/node.md says the same): Debian 12's criu 3.17 fails on
# current kernels and 4.1 (Debian 13's) cannot dump TCP sockets on kernels >= 6.16
CRIU_FIX = ("install CRIU >= 4.2 and put it first on PATH: Debian forky's `apt-get install criu`, or on Debian 12 "
            "and 13 build it from https://github.com/checkpoint-restore/criu (`make && make install "
            "PREFIX=/usr/local`, which puts /usr/local/sbin/criu first on PATH); see docs/node.md")


def check_criu() -> str:
    install_fix = CRIU_FIX
    try:
        version_text = process.run(["criu", "--version"], timeout_s=30).stdout
    except process.CommandError as error:
        raise CheckFailed(f"criu: {error}", install_fix) from None
    match = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", version_text)
    if not match or int(match.group(1)) < MIN_CRIU_MAJOR:
        raise CheckFailed(f"criu {match.group(0) if match else version_text.strip()!r} is older than "
                          f"{MIN_CRIU_MAJOR}", install_fix)
    check = process.run(["criu", "check"], timeout_s=60, check=False)
    if check.returncode != 0 or "Looks good" not in check.stdout + check.stderr:
        last = (check.stderr.strip() or check.stdout.strip() or "no output").splitlines()[-1]
        raise CheckFailed(f"criu check failed: {last}", "run `criu check` and fix what it reports")
    return f"criu {match.group(1)}.{match.group(2)}: criu check looks good"


def check_criu_image_definitions() -> str:
    """Every restore reads CRIU's images with CRIU's own message definitions; without them each
    restore is refused."""
    try:
        criu_messages()
    except ImageError as error:
        raise CheckFailed(str(error), "install Debian's python3-pycriu (forky or newer), or the bindings of the "
                                      "CRIU you built (`make install-lib` in its source tree); see docs/node.md") \
            from None
    return "CRIU's image definitions (python3-pycriu) load: restores can be checked"


def check_config_and_delegate() -> str:
    path = config_path()
    try:
        config = load_config(path)
        delegate = resolve_delegate(config.delegate, path)
        version = delegate_version(delegate).splitlines()[0]
    except GpuckptError as error:
        raise CheckFailed(str(error), f"fix {path} (see docs/configuration.md)") from None
    source = path if os.path.exists(path) else "defaults"
    return f"config {source}: delegate {delegate} ({version})"


def check_trust() -> str:
    """The node key and the trust policy; every source allowed unsigned, named."""
    try:
        trust = load_trust()
    except GpuckptError as error:
        raise CheckFailed(str(error), f"fix {policy_path()} or {node_key_path()} (see docs/signed-moves.md)") \
            from None
    if trust.node_key_id is None:
        raise CheckFailed(f"{node_key_path()}: this node has no signing key: gpuckpt export cannot sign",
                          "gpuckpt install --engine podman (makes the key)")
    names = ", ".join(sorted(entry.name for entry in trust.policy.key)) or "none"
    line = f"trust: node key {trust.node_key_id} ({node_key_path()}) signs exports and dumps; trusted keys: {names}; "
    if unsigned := [rule.source for rule in trust.policy.allow_unsigned]:  # works, but whoever wrote it is trusted
        raise CheckWarned(f"{line}UNSIGNED accepted (logged) from: {'; '.join(unsigned)}",
                          f"once they are no longer needed: gpuckpt trust disallow-unsigned {unsigned[0]}"
                          + (" (and the others)" if len(unsigned) > 1 else ""))
    return f"{line}unsigned checkpoints refused"


def check_network_lock() -> str:
    if not (find_program("iptables-restore") or find_program("nft")):
        raise CheckFailed("neither iptables-restore nor nft found: CRIU cannot lock the network",
                          "apt-get install iptables")
    return "CRIU network lock tool present"


def _check_engine(engine: str, program: str, registration: Callable[[], tuple[str | None, bool]]) -> str | None:
    """An installed engine must have the runtime registered; an absent one is not checked."""
    if not find_program(program):
        return None
    path, default = registration()
    if not path:
        raise CheckFailed(f"{engine}: gpuckpt-runtime is not registered", f"gpuckpt install --engine {engine}")
    return f"{engine}: gpuckpt-runtime registered ({path}){', the default' if default else ''}"


def check_podman() -> str | None:
    def registration() -> tuple[str | None, bool]:
        paths, default = podman_registration()
        return (paths[0] if paths else None), default
    return _check_engine("podman", "podman", registration)


def check_podman_runtime_names() -> str | None:
    """Runtimes podman's own `restore --import` would run past gpuckpt's restore checks: every one installed
    whose name does not resolve to gpuckpt-runtime (install --default maps the delegate's, runc or crun)."""
    if not find_program("podman"):
        return None
    paths, _ = podman_registration()
    if not paths:
        return None  # check_podman says so
    table = podman_runtimes()
    unchecked = [name for name in PODMAN_RUNTIME_NAMES
                 if find_program(name) and not stands_in(table.get(name, []), paths[0])]
    if unchecked:
        raise CheckWarned(f"podman's own `restore --import` runs an archive that names {', '.join(unchecked)} (or a "
                          "runtime by path) with that runtime, past gpuckpt's restore checks",
                          "restore archives from elsewhere with `gpuckpt import`, the checked path; or remove the "
                          "runtimes this node does not use")
    return "podman: every installed runtime name resolves to gpuckpt-runtime (a runtime by path still does not)"


def check_docker() -> str | None:
    return _check_engine("docker", "dockerd", docker_registration)


def _containerd_major() -> int | None:
    """The major version of the containerd on PATH (None: none, or no version in its answer)."""
    if not find_program("containerd"):
        return None
    answer = process.run(["containerd", "--version"], timeout_s=30, check=False).stdout
    found = re.search(r" v?(\d+)\.\d+", answer)
    return int(found.group(1)) if found else None


def check_containerd(config: str = CONTAINERD_CONFIG) -> str | None:
    """A CRI handler in containerd's config must run an executable gpuckpt-runtime through the runc v2 shim; none
    is needed unless containerd is 2.x (CRI checkpoint and restore; a 1.x on PATH is docker's). A 2.x beside a
    docker that runs gpuckpt-runtime (docker.io 28 brings containerd 2.1, config file included) may be docker's
    only: a warning."""
    binary, runtime_type = containerd_registration(config)
    fix = f"gpuckpt install --engine containerd{'' if config == CONTAINERD_CONFIG else f' --config {config}'}"
    if binary is None and runtime_type is None:
        if os.path.exists(config) and (_containerd_major() or 0) >= 2:
            if docker_registration()[0] is not None:
                raise CheckWarned(f"containerd: no CRI runtime handler {HANDLER!r} in {config}: Kubernetes pods "
                                  "on this node do not go through gpuckpt (docker's containers do)", fix)
            raise CheckFailed(f"containerd: no CRI runtime handler {HANDLER!r} in {config}", fix)
        return None
    if runtime_type != SHIM_RUNTIME_TYPE or not binary or not os.access(binary, os.X_OK):
        raise CheckFailed(f"containerd: handler {HANDLER!r} in {config} runs {binary!r} through {runtime_type!r}, "
                          f"not an executable gpuckpt-runtime through {SHIM_RUNTIME_TYPE}", fix)
    return f"containerd: CRI runtime handler {HANDLER!r} runs {binary} ({config})"


def check_hook() -> str | None:
    """gpuckpt-hook beside the runtime, and reaching every engine here: podman through hooks.d, docker
    through the runtime's create; the inventory it keeps."""
    runtime = find_program("gpuckpt-runtime")
    if runtime is None:
        return None  # check_podman and check_docker say what is missing
    hook = hook_beside(os.path.realpath(runtime))
    if not os.access(hook, os.X_OK):
        raise CheckFailed(f"gpuckpt-hook is not beside {runtime}", "reinstall gpuckpt (packaging/install.sh)")
    reached = []
    if find_program("podman"):
        wanted = hooks_d_files(hook)
        if not any(all(read_engine_file(os.path.join(directory, name)) == text for name, text in wanted.items())
                   for directory in (PODMAN_HOOKS_DIR, PACKAGED_HOOKS_DIR)):
            raise CheckFailed(f"podman: no hooks.d file runs {hook}", "gpuckpt install --engine podman")
        reached.append("podman")
    if find_program("dockerd"):
        if not load_config().hook.add_to_spec:
            raise CheckFailed(f"docker: hook.add_to_spec is off in {config_path()}", "gpuckpt install --engine docker")
        reached.append("docker")
    # a record that does not parse is left out here (gpuckptd logs it): python-systemd is the service's alone
    records = recorded_containers(lambda _message, _id: None) if os.path.isdir(inventory_dir()) else []
    said = f"gpuckpt-hook ({hook}) reaches {', '.join(reached) or 'no engine'}; {len(records)} container(s) recorded"
    if gone := through_engine.removed(records):  # gpuckptd drops them; where it does not run, they stay
        raise CheckWarned(f"{said}, {len(gone)} of them of containers their engine no longer has "
                          f"({', '.join(short_id(record.id) for record in gone)}): podman runs no poststop hook for a "
                          "container it restored, so its `podman rm` leaves the record", "gpuckptd drops them (every "
                          f"30 s while it runs); without it, remove {inventory_dir()}/ID.json of each")
    return said


def _unit_properties(unit: str, *names: str) -> dict[str, str]:
    shown = process.run(["systemctl", "show", unit, f"--property={','.join(names)}"], timeout_s=30)
    return dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)


def check_service() -> str | None:
    """Where systemd runs and gpuckptd's unit is installed: enabled (at boot it restores what the drain
    at shutdown left) and running (it drains at shutdown); what it says, and what waits for a restore."""
    if not os.path.isdir(SYSTEMD_RUN_DIR) or not find_program("systemctl"):
        return _foreground_service()
    try:
        unit = _unit_properties(SERVICE_UNIT, "LoadState", "UnitFileState", "ActiveState", "SubState", "StatusText")
    except process.CommandError as error:
        raise CheckFailed(f"cannot ask systemd about {SERVICE_UNIT}: {error}", "systemctl status must answer") from None
    load_state, file_state = unit.get("LoadState", ""), unit.get("UnitFileState", "")
    if load_state == "not-found":
        return None  # installed from the source tree (packaging/install.sh), which installs no unit
    masked = "masked" in (load_state, file_state)
    if load_state != "loaded" or masked:
        raise CheckFailed(f"{SERVICE_UNIT} is {'masked' if masked else load_state}: nothing drains this node's "
                          "containers at shutdown", "systemctl unmask gpuckptd" if masked
                          else "systemctl status gpuckptd says what is wrong with the unit")
    if file_state not in ENABLED_STATES:
        raise CheckFailed(f"{SERVICE_UNIT} is {file_state or 'not enabled'}: it does not start at boot, where it "
                          "restores what the drain at shutdown left", "systemctl enable --now gpuckptd")
    active, sub_state = unit.get("ActiveState", ""), unit.get("SubState", "")
    if active not in ("active", "activating"):  # activating: restoring what a drain left, before READY
        raise CheckFailed(f"{SERVICE_UNIT} is {active} ({sub_state}): nothing drains this node's containers at "
                          "shutdown", "systemctl start gpuckptd (journalctl -u gpuckptd says why it stopped)")
    config = load_config().service
    stop = "drains at stop" if config.drain_on_stop else "does NOT drain at stop (service.drain_on_stop = false)"
    return f"{SERVICE_UNIT} {file_state}, {active}: {unit.get('StatusText') or sub_state}; {stop}; " + (
        _service_status(config.socket) if active == "active" else "not serving yet")


def _foreground_service() -> str | None:
    """Where systemd is not PID 1 nothing starts gpuckptd: it runs in the foreground (a terminal, another
    supervisor) or not at all, and doctor says which (it said nothing: issue 33). Its API answers only root."""
    socket_path = load_config().service.socket
    if os.geteuid() != 0:
        return None
    try:
        status = _ask_status(socket_path)
    except (GpuckptError, OSError):
        raise CheckWarned(f"gpuckptd does not answer on {socket_path} and systemd is not PID 1 to start it: nothing "
                          "drains this node's containers at shutdown or on a preemption notice, and no periodic "
                          "checkpoint is taken", "run gpuckptd in the foreground, or under this node's supervisor "
                          "with --drain-on-stop to drain at shutdown (gpuckptd --help; docs/node.md)") from None
    recorded = (f": {len(status.recorded)} container(s) recorded, {len(status.drained)} drained waiting"
                if status else "")
    return f"gpuckptd answers on {socket_path} (in the foreground: systemd is not PID 1){recorded}"


def _ask_status(socket_path: str) -> Status | None:
    """The running service's status answer (None: it answered without one); its API answers only root."""
    # a status answer is immediate
    return next((event for event in list(request(socket_path, Request(op="status"), STATUS_TIMEOUT_S))
                 if isinstance(event, Status)), None)


def _service_status(socket_path: str) -> str:
    """What the running service itself says (its API answers only root)."""
    if os.geteuid() != 0:
        return "run as root to ask it"
    try:
        status = _ask_status(socket_path)
    except (GpuckptError, OSError) as error:
        raise CheckFailed(f"{SERVICE_UNIT} is active but its API does not answer: {error}",
                          "journalctl -u gpuckptd says what it is doing") from None
    if status is None:
        raise CheckFailed(f"{SERVICE_UNIT} answered on {socket_path} without a status", "journalctl -u gpuckptd")
    busy = f", busy: {status.busy}" if status.busy else ""
    return f"{len(status.recorded)} container(s) recorded, {len(status.drained)} drained waiting for a restore{busy}"


def check_preemption() -> str | None:
    """A preemption gpuckptd took and nobody cleared (service/preemption.py): periodic checkpoints and idle
    reclaim wait and new notices are not watched until `gpuckpt service reset`, which only a restart did too.
    Asked wherever gpuckptd answers, under systemd or in the foreground; nothing said where it does not (as
    root, check_service says whether it should) or where only root may ask."""
    service = load_config().service
    socket_path = service.socket
    if os.geteuid() != 0 or not os.path.exists(socket_path):
        return None
    try:
        status = _ask_status(socket_path)
    except (GpuckptError, OSError):
        return None  # check_service names a service that does not answer
    preemption = status.preemption if status else None
    if preemption is None:
        return None  # a gpuckptd older than its client, or one still starting
    if preemption.state == "watching":
        return f"gpuckptd watches for preemption: {', '.join(preemption.sources)}"
    when = (f"notice at {preemption.noticed_at} from {preemption.source}, the node goes at (deadline) "
            f"{preemption.deadline_at}")
    if preemption.state == "draining":
        raise CheckWarned(f"gpuckptd is draining for a preemption: {when}; periodic checkpoints and idle reclaim "
                          "wait", "once its drain ends, if the node stays: gpuckpt service restore, then gpuckpt "
                          "service reset (gpuckpt service status shows the drain)")
    # a notice file still there would only get the reset refused (service/preemption.py): named first
    notice = (f"remove {service.preemption_file} (the notice; a reset is refused while it exists), "
              if service.preemption_file and os.path.exists(service.preemption_file) else "")
    raise CheckWarned(f"a preemption is pending in gpuckptd: {when}; {preemption.drain or 'drain ended'}; "
                      "periodic checkpoints and idle reclaim wait and new notices are not watched",
                      f"if the node stays: {notice}gpuckpt service restore (brings back what the drain left), then "
                      "gpuckpt service reset (watching again, without a restart)")


def check_resident_helper() -> str:
    """Whether gpuckpt-runtimed takes the owned verbs (it listens, and the runtime would hand them to it):
    without it each works in-process at the cost of loading its code, which fails nothing."""
    path = resident_socket_path()
    refusal = listener_refusal()
    if refusal is None:
        return (f"gpuckpt-runtimed listens on {path}: owned verbs (checkpoint, restore, ...) start with their code "
                f"loaded (~{RESIDENT_ADDED_MS} ms each over runc's)")
    fix = (f"systemctl enable --now {RESIDENT_UNIT}" if os.path.isdir(SYSTEMD_RUN_DIR)
           else "start gpuckpt-runtimed (beside gpuckpt-runtime) under this node's service manager")
    raise CheckWarned(f"the runtime's resident helper is not in use ({path}: {refusal}): owned verbs (checkpoint, "
                      f"restore, ...) run in-process, ~{IN_PROCESS_ADDED_MS} ms each over runc's instead of "
                      f"~{RESIDENT_ADDED_MS} ms", fix)


NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"  # made by the NVIDIA driver's kernel module


def check_driver() -> str:
    """Only on a node with an NVIDIA GPU: the driver's checkpoint API must be there."""
    if not os.path.exists(NVIDIA_CONTROL_DEVICE):
        raise CheckSkipped(f"GPU checks skipped: no NVIDIA GPU driver on this node ({NVIDIA_CONTROL_DEVICE} absent); "
                           "CPU containers are checkpointed as runc does")

    try:
        version = load_driver().driver_version()
    except GpuckptError as error:
        raise CheckFailed(str(error), "install NVIDIA driver 570 or newer (580+ to restore onto other GPUs)") from None
    return f"CUDA driver {version_text(version)} has the process checkpoint API"


CDI_DIRS_ENV = "GPUCKPT_CDI_DIRS"  # where doctor looks for CDI specs instead (colon-separated): docs/cdi.md
CDI_FIX = ("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml, again after each driver install or upgrade "
           "(docs/cdi.md)")


def cdi_report(dirs: Sequence[str], driver: str | None) -> str:
    """The CDI specs in `dirs`: the devices they name (what `--device KIND=NAME` the engines accept), and whether
    the driver files they mount are the loaded driver's (`driver`; None: no NVIDIA driver, nothing to check)."""
    if driver is None:
        raise CheckSkipped("GPU/CDI: skipped: no NVIDIA driver loaded (no /sys/module/nvidia/version, "
                           "/proc/driver/nvidia/version)")
    files = list(spec_files(dirs))
    if not files:
        raise CheckWarned(f"GPU/CDI: no CDI spec (*.json, *.yaml) in {', '.join(dirs)}: podman, docker and "
                          "containerd cannot hand out nvidia.com/gpu=N", CDI_FIX)
    problems: list[str] = []
    seen: list[str] = []
    for found in files:
        if found.spec is None:
            problems.append(f"{found.path}: {found.problem}")
            continue
        versions = found.spec.driver_versions()
        lacking = [mount.hostPath for mount in found.spec.mounts() if not os.path.exists(mount.hostPath)]
        if versions and driver not in versions:
            other = ", ".join(f"{version} ({path})" for version, path in versions.items())
            problems.append(f"{found.path} mounts driver {other}, the loaded driver is {driver}")
        elif lacking:
            problems.append(f"{found.path} mounts {len(lacking)} host file(s) this node lacks ({lacking[0]})")
        files_of = (f"driver files of {driver} (the loaded driver)" if versions
                    else "no driver library" if found.spec.kind.startswith("nvidia.com/") else "")
        seen.append(f"{found.path}: {', '.join(found.spec.device_names()) or 'no devices'}"
                    + (f"; {files_of}" if files_of else ""))
    if problems:
        raise CheckFailed("GPU/CDI: " + "; ".join(problems) + ": containers given its devices get files of "
                          "another driver, or none", CDI_FIX)
    return "GPU/CDI: " + "; ".join(seen)


def check_cdi() -> str:
    dirs = [d for d in os.environ.get(CDI_DIRS_ENV, "").split(":") if d] or list(CDI_DIRS)
    return cdi_report(dirs, loaded_module_version())


def check_cgroup_hierarchies() -> str | None:
    """A cgroup v1 hierarchy nothing mounts makes crun's restore kill every process (host/cgroup_v1.py)."""
    if not hybrid_or_legacy():
        return None
    if hierarchy := stale_hierarchy_for_crun():
        options = hierarchy if not hierarchy.startswith("name=") else f"none,{hierarchy}"
        raise CheckFailed(
            f"the cgroup v1 hierarchy '{hierarchy}' is not mounted at {crun_directory(hierarchy)}: crun's restore "
            f"would kill every process on the node (gpuckpt-runtime refuses such restores)",
            f"once no process runs in its cgroups, remove them: unshare -m sh -c 'd=$(mktemp -d); "
            f"mount -t cgroup -o {options} cgroup $d && find $d -mindepth 1 -depth -type d -exec rmdir {{}} +; "
            f"umount $d' (twice: the kernel lets the emptied hierarchy go at an unmount)")
    return "cgroup v1: crun's restore finds its own cgroup (no hierarchy is mounted only elsewhere)"


def check_journals() -> str:
    """A journal no live gpuckpt holds was left by a killed gpuckpt-runtime (node/journal.py)."""
    if left := left_journals():
        raise CheckFailed(f"{len(left)} checkpoint(s) or restore(s) a killed gpuckpt-runtime left unfinished "
                          f"({', '.join(key.container[:12] for key in left[:5])}): their CUDA processes may be locked",
                          "gpuckpt recover")
    return "no checkpoint or restore left unfinished by a killed gpuckpt-runtime"


CHECKS: list[Callable[[], str | None]] = [
    check_kernel, check_cgroup_hierarchies, check_criu, check_criu_image_definitions, check_config_and_delegate,
    check_trust, check_network_lock, check_journals,
    check_podman, check_podman_runtime_names, check_docker, check_containerd, check_hook, check_service,
    check_preemption, check_resident_helper,
    check_driver, check_cdi,
]


def _run_check(check: Callable[[], str | None], containerd_config: str) -> DoctorCheck | None:
    name = check.__name__.removeprefix("check_")
    try:
        line = check_containerd(containerd_config) if check is check_containerd else check()
    except CheckFailed as failed:
        return DoctorCheck(check=name, level="fail", message=str(failed), fix=failed.fix)
    except CheckWarned as warned:
        return DoctorCheck(check=name, level="warn", message=str(warned), fix=warned.fix)
    except CheckSkipped as skipped:
        return DoctorCheck(check=name, level="skip", message=str(skipped))
    except ConfigError:  # check_config_and_delegate's own is its CheckFailed, with the fix
        # one bad value failed every check that reads the config, each with the same line: one cause, one FAIL
        return DoctorCheck(check=name, level="skip", message=f"{name}: skipped: the configuration does not load "
                                                             "(its FAIL line says why)")
    except GpuckptError as error:
        return DoctorCheck(check=name, level="fail", message=str(error))
    return None if line is None else DoctorCheck(check=name, level="ok", message=line)


def report(containerd_config: str = CONTAINERD_CONFIG) -> DoctorReport:
    """Every check that applies here, in CHECKS' order."""
    checks = [found for check in CHECKS if (found := _run_check(check, containerd_config)) is not None]
    return DoctorReport(checks=checks, failed=sum(check.level == "fail" for check in checks),
                        warned=sum(check.level == "warn" for check in checks))


LEVEL_TEXT = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}  # FAIL stands out in a column of ok


def run(options: argparse.Namespace) -> int:
    done = report(options.containerd_config)
    if options.json:
        done.print_json()
    else:
        for check in done.checks:
            fix = f"\n       fix: {check.fix}" if check.fix else ""
            print(f"{LEVEL_TEXT[check.level]:<4}   {check.message}{fix}")
    return 1 if done.failed else 0
