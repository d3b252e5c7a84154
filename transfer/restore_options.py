"""podman's restore options, passed through by `gpuckpt import` and `gpuckpt store restore`: each checked
against an allow-list, passed only where the installed podman has it, and a name already taken refused
before anything is read or staged.

What each means for the import's checks: --ignore-rootfs and --ignore-volumes have podman leave the
container's changed files and its volumes' content out, so the import stages none of them (they are still
checked as they pass) and the shim, which applies only what was staged, applies none (transfer/staging.py).
--publish values are parsed here ([[IP:][HOST_PORT]:]CONTAINER_PORT[/PROTOCOL], ports or ranges) and given
to podman as one `--publish=VALUE` each, never as raw words; --pod must name a pod that exists, and is given
to podman as the pod's ID (podman 4.3's restore looks a pod up by name, then adds the container by that name as
if it were an ID: "pod with ID NAME not found"); an archive's container restores into a pod exactly when it was
in one (podman's own rule, said before anything is staged).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import NotFoundError, UsageError
from ..host.process import run
from ..oci.podman_archive import CONFIG_DUMP, PodmanConfigDump, with_runtime
from .gpu_move import GpuMove

NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,252}")  # podman's container and pod names
PORTS = r"[0-9]{1,5}(?:-[0-9]{1,5})?"
PUBLISH = re.compile(rf"(?:(?:(?P<ip>[0-9.]{{7,15}}|\[[0-9A-Fa-f:.]{{2,45}}\]):)?(?P<host>{PORTS})?:)?"
                     rf"(?P<container>{PORTS})(?:/(?P<protocol>tcp|udp|sctp))?")
PUBLISH_SYNTAX = "[[IP:][HOST_PORT]:]CONTAINER_PORT[/tcp|udp|sctp], ports or ranges (8000-8010) of 1-65535"


@dataclass(frozen=True)
class RestoreOptions:
    """The podman restore options an import or a store restore passes on (each one of podman's flags)."""

    name: str | None = None  # --name: the restored container's name (podman then gives it a new ID)
    tcp_established: bool = False
    publish: tuple[str, ...] = ()  # --publish, each checked (check_publish)
    pod: str | None = None  # --pod: an existing pod the container joins, as given
    pod_id: str | None = None  # that pod's full ID (require_pod), what podman is given
    ignore_static_ip: bool = False
    ignore_static_mac: bool = False
    keep: bool = False  # --keep: podman keeps its temporary checkpoint files (they hold process memory)
    ignore_rootfs: bool = False  # the archive's rootfs-diff.tar and deleted.files not applied (nor staged)
    ignore_volumes: bool = False  # its volumes/*.tar not applied (nor staged)
    # --gpu: not podman's; the staged config.dump and spec.dump name these CDI devices instead (transfer/gpu_move.py)
    gpus: tuple[str, ...] = ()

    def flags(self) -> list[str]:
        """podman's words for these options, each value joined to its flag (never read as an option)."""
        switches = {"--tcp-established": self.tcp_established, "--ignore-static-ip": self.ignore_static_ip,
                    "--ignore-static-mac": self.ignore_static_mac, "--keep": self.keep,
                    "--ignore-rootfs": self.ignore_rootfs, "--ignore-volumes": self.ignore_volumes}
        words = [f"--name={self.name}"] if self.name else []
        words += [flag for flag, wanted in switches.items() if wanted]
        words += [f"--publish={value}" for value in self.publish]
        pod = self.pod_id or self.pod
        return words + ([f"--pod={pod}"] if pod else [])

    def check(self) -> None:
        """Every value within its allow-list (a one-line UsageError naming the first that is not)."""
        for flag, value in (("--name", self.name), ("--pod", self.pod)):
            if value is not None and not NAME.fullmatch(value):
                raise UsageError(f"{flag} {value[:80]!r}: give a name of letters, digits, '_', '.', '-' "
                                 "(starting with a letter or digit, at most 253)")
        for value in self.publish:
            check_publish(value)
        self.gpu_move()

    def gpu_move(self) -> GpuMove | None:
        return GpuMove(self.gpus) if self.gpus else None

    def rewrites(self, runtime: str) -> tuple[dict[str, Callable[[bytes], bytes]], GpuMove | None]:
        """What the import changes in the archive's small files as they pass to podman: config.dump names
        `runtime` (and, with --gpu, the devices moved, as spec.dump's nodes); the move, once planned."""
        named: Callable[[bytes], bytes] = lambda data: with_runtime(data, runtime)  # noqa: E731
        move = self.gpu_move()
        return (move.rewrites(named) if move else {CONFIG_DUMP: named}), move


def check_publish(value: str) -> None:
    matched = PUBLISH.fullmatch(value)
    problem = "" if matched else "not of that form"
    if matched:
        if (ip := matched["ip"]) is not None:
            try:
                ipaddress.ip_address(ip.strip("[]"))
            except ValueError:
                problem = f"{ip} is not an IP address"
        for which in ("host", "container"):
            low, _, high = (matched[which] or "1").partition("-")
            if not 1 <= int(low) <= int(high or low) <= 65535:
                problem = problem or f"{which} port {matched[which]} is not a port or range of 1-65535"
        if matched["host"] and "-" in matched["host"] and "-" in matched["container"] and \
                _span(matched["host"]) != _span(matched["container"]):
            problem = problem or "the host and container ranges differ in length"
    if problem:
        raise UsageError(f"--publish {value[:80]!r}: {problem}; give {PUBLISH_SYNTAX}")


def _span(ports: str) -> int:
    low, _, high = ports.partition("-")
    return int(high) - int(low)


@functools.cache
def _restore_flags(podman: str) -> frozenset[str]:
    """The long options the installed podman's `container restore` has (from its own --help)."""
    helped = run([podman, "container", "restore", "--help"], check=False).stdout
    return frozenset(re.findall(r"(?m)^\s+(?:-\w, )?(--[a-z][a-z-]+)", helped))


def require_supported(podman: str, options: RestoreOptions) -> None:
    """Every flag asked for is one the installed podman's restore has: else one line naming its version."""
    wanted = [word.partition("=")[0] for word in options.flags()]
    if missing := [flag for flag in dict.fromkeys(wanted) if flag not in _restore_flags(podman)]:
        version = run([podman, "--version"], check=False).stdout.strip().rpartition(" ")[2] or "(version unknown)"
        raise UsageError(f"{', '.join(missing)}: podman {version}'s `container restore` has no such option: leave "
                         f"{'them' if len(missing) > 1 else 'it'} out, or upgrade podman")


def refuse_taken(podman: str, name: str, container_id: str | None = None) -> None:
    """A container of that name (or, kept by an import without --name, that ID) already exists: refused at
    once, before anything is read, checked or staged (podman would refuse it only after all that)."""
    for what, taken in (("name", name), ("ID", container_id)):
        if taken and run([podman, "container", "exists", taken], check=False).returncode == 0:
            hint = "give --name NEW, or remove it first" if what == "name" else "give --name NEW"
            raise UsageError(f"a container with the {what} {taken[:64]} already exists on this node: refused ({hint})")


def require_pod(podman: str, pod: str | None) -> str | None:
    """The full ID of the existing pod `pod` names (None where no --pod is given)."""
    if not pod:
        return None
    found = run([podman, "pod", "inspect", "--format", "{{.ID}}", pod], check=False)
    pod_id = found.stdout.strip()
    if found.returncode != 0 or not re.fullmatch(r"[0-9a-f]{64}", pod_id):
        raise NotFoundError(f"--pod {pod}: no such pod on this node (podman pod create makes one)")
    return pod_id


def refuse_as_config_says(podman: str, what: str, config: PodmanConfigDump, options: RestoreOptions) -> None:
    """What `what`'s config.dump refuses before anything is staged: without --name podman keeps the checkpointed
    container's name and ID (one taken: refused), and a pod is asked for exactly when the container was in one."""
    if not options.name:
        refuse_taken(podman, config.name, config.id)
    refuse_pod_mismatch(what, config.pod, options.pod)


def refuse_pod_mismatch(what: str, archive_pod: str, pod: str | None) -> None:
    """podman restores a container that was in a pod only into a pod (--pod), and one that was not only outside
    one; said in one line from config.dump, before anything is staged (podman says it only after)."""
    if archive_pod and not pod:
        raise UsageError(f"{what}: its container was in a pod (ID {archive_pod[:12]}): podman restores it only "
                         "into a pod; give --pod POD, an existing pod that shares the same namespaces (podman pod "
                         "create makes one)")
    if pod and not archive_pod:
        raise UsageError(f"--pod {pod}: the container of {what} was in no pod, and podman restores such a "
                         "container only outside one: leave --pod out")
