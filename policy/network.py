"""Which CRIU network options a checkpoint needs, from what the container's sockets are doing.

The sockets are read through sock_diag (pyroute2's DiagSocket) inside the container's
network namespace and matched to the container's processes by inode (host/processes.py's
snapshot); file locks are the snapshot's too. A container whose processes hold no socket is not looked at: pyroute2
(~75 ms to import, a quarter of the shim's own time on a checkpoint) is loaded only for one
that does. The operator's policy (config `criu.*`) decides what is added; an
option the engine passed itself is always left as it is.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import ValidationError

from ..errors import ConfigError
from ..host.processes import Processes
from ..oci.manifest import NetworkOption, NetworkPolicy
from .annotations import tightened

if TYPE_CHECKING:
    from ..node.config import CriuConfig

TCP_LISTEN, TCP_CLOSE = 10, 7
UDIAG_SHOW_PEER = 0x04
# CRIU's network options by the name the policy and the engine's flags use.
NETWORK_OPTIONS: dict[str, NetworkOption] = {"tcp-established": "--tcp-established", "ext-unix-sk": "--ext-unix-sk",
                                             "file-locks": "--file-locks"}


@dataclass
class SocketsFound:
    tcp_connected: list[str] = field(default_factory=list)  # "src:port -> dst:port state N"
    tcp_listening: list[str] = field(default_factory=list)
    tcp_remote: int = 0  # connected sockets whose peer is not on loopback
    unix_external: list[int] = field(default_factory=list)  # our inodes whose peer is outside
    file_locks: int = 0
    unreadable: str = ""  # why the sockets could not be read (then nothing is added for them)


def _is_loopback(address: str) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(parsed, "ipv4_mapped", None)
    return (mapped or parsed).is_loopback


def _diag(init_pid: int, inodes: set[int]) -> SocketsFound:
    """sock_diag in the container's network namespace (this thread only, then back)."""
    from pyroute2 import DiagSocket  # deferred: only containers that hold sockets pay for it (above)
    from pyroute2.netns import popns, pushns

    found = SocketsFound()
    pushns(f"/proc/{init_pid}/ns/net")
    try:
        with DiagSocket() as diag:
            diag.bind()
            for family in (socket.AF_INET, socket.AF_INET6):
                for entry in diag.get_sock_stats(family=family):
                    if entry["idiag_inode"] not in inodes:
                        continue
                    state = entry["idiag_state"]
                    where = (
                        f"{entry['idiag_src']}:{entry['idiag_sport']} -> {entry['idiag_dst']}:{entry['idiag_dport']}"
                    )
                    if state == TCP_LISTEN:
                        found.tcp_listening.append(where)
                    elif state != TCP_CLOSE:
                        found.tcp_connected.append(f"{where} state {state}")
                        if not _is_loopback(entry["idiag_dst"]):
                            found.tcp_remote += 1
            for entry in diag.get_sock_stats(family=socket.AF_UNIX, show=UDIAG_SHOW_PEER):
                inode = entry["udiag_ino"]
                peer = entry.get_attr("UNIX_DIAG_PEER")
                if inode in inodes and peer and peer not in inodes:
                    found.unix_external.append(inode)
    finally:
        popns()
    return found


def inspect_sockets(init_pid: int, processes: Processes) -> SocketsFound:
    """What the container's sockets are doing, and the file locks its processes hold."""
    inodes = processes.socket_inodes
    try:
        found = _diag(init_pid, inodes) if inodes else SocketsFound()
    except (OSError, ImportError) as error:  # not root, no pyroute2, the process gone
        found = SocketsFound(unreadable=f"{type(error).__name__}: {error}")
    found.file_locks = processes.file_locks
    return found


def choose(found: SocketsFound, engine_flags: set[str], policy: CriuConfig) -> NetworkPolicy:
    """The options to add, given what was found, what the engine passed and the operator's policy."""
    # "auto" leaves loopback-only connections alone: runc 1.1 brings a restored namespace's
    # lo up after CRIU reconnects sockets, so such a checkpoint would dump the container and
    # then never restore ("Can't connect inet socket back: Network is unreachable"). Without
    # the option the dump fails and the container keeps running; "always" forces it.
    wanted = {
        "tcp-established": policy.tcp_established == "always"
        or (policy.tcp_established == "auto" and found.tcp_remote > 0),
        "ext-unix-sk": policy.ext_unix_sk == "auto" and bool(found.unix_external),
        "file-locks": policy.file_locks == "auto" and found.file_locks > 0,
    }
    added = [NETWORK_OPTIONS[name] for name, want in wanted.items() if want and name not in engine_flags]
    return NetworkPolicy(
        tcp_connected=found.tcp_connected, tcp_listening=found.tcp_listening,
        unix_external=len(found.unix_external), file_locks=found.file_locks,
        engine_options=sorted(NETWORK_OPTIONS[name] for name in engine_flags & set(wanted)),
        added_options=added, network_lock=policy.network_lock, sockets_unreadable=found.unreadable)


def missing_option_hint(chosen: NetworkPolicy, engine_flags: set[str]) -> str | None:
    """For a failed dump: the option the container needed and did not get, as one sentence."""
    if (
        chosen.tcp_connected
        and "tcp-established" not in engine_flags
        and "--tcp-established" not in chosen.added_options
    ):
        return (f"the container has {len(chosen.tcp_connected)} established TCP connection(s) "
                f"({chosen.tcp_connected[0]}): checkpoint with --tcp-established, or set "
                "criu.tcp_established = \"always\" in the gpuckpt config (\"auto\" adds it only for "
                "connections leaving the container: runc cannot restore loopback ones)")
    return None


# Per-container choices a container's annotations may make, no looser than the operator's;
# CRIU's network lock stays the operator's.
POLICY_ANNOTATIONS = {
    "io.gpuckpt.criu.tcp-established": "tcp_established",
    "io.gpuckpt.criu.ext-unix-sk": "ext_unix_sk",
    "io.gpuckpt.criu.file-locks": "file_locks",
}


def container_policy(policy: CriuConfig, annotations: dict[str, str], container_id: str = "") -> CriuConfig:
    """The operator's policy with the container's own choices (annotations) applied: each
    validated, and refused (PolicyError) where it would loosen the operator's."""
    chosen = {key: annotations[name] for name, key in POLICY_ANNOTATIONS.items() if name in annotations}
    if not chosen:
        return policy
    try:
        validated = policy.model_validate({**policy.model_dump(), **chosen})
    except ValidationError as error:
        first = error.errors()[0]
        name = next(n for n, key in POLICY_ANNOTATIONS.items() if key == first["loc"][0])
        raise ConfigError(f"annotation {name}={annotations[name]!r}: {first['msg']}") from None
    for name, key in POLICY_ANNOTATIONS.items():
        if key in chosen:
            tightened(getattr(policy, key), name, getattr(validated, key), container_id)
    return validated
