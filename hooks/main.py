"""`gpuckpt-hook STAGE`: the OCI hook that keeps the node's GPU container inventory.

createRuntime: a container given /dev/nvidiaN devices (or annotated io.gpuckpt.inventory=true)
is recorded (id, engine, bundle, GPUs by UUID, creation time, its io.gpuckpt.* annotations) in
node/inventory.py's directory; one asking for a GPU this node does not have is refused with one
line, before its process runs (for a restore: in CRIU's setup-namespaces callback, before any
process memory is restored). In the same callback, a container with a network namespace of its own gets its
`lo` set up: runc's restore makes that namespace empty, `lo` down, and CRIU could not connect the container's
loopback TCP connections back (--tcp-established: "Network is unreachable", plain runc too); at a create runc
sets it up a moment later anyway. poststop: the record goes.
Every other container costs one read of its config.json: the hook runs on every container start
(hooks.d has no device condition), so it imports only the stdlib and gpuckpt's light modules.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

from ..cuda.proc_gpus import gpu_uuids_by_minor, nvidia_proc
from ..errors import GpuckptError
from ..host.netns import in_netns_of, loopback_up
from ..host.safefiles import read_bounded
from ..node.hook_entry import STAGES
from ..node.inventory import check_container_id, remove_record, write_record
from ..oci.bundle_layout import in_containers_storage
from ..oci.nvidia_paths import gpu_minor
from ..oci.timestamps import utc_now

if TYPE_CHECKING:
    import argparse

MAX_STATE_BYTES = 16 << 20  # podman allows megabytes of annotations
MAX_VISIBLE_DEVICES = 1024  # node/container_record.py's bound
MAX_SPEC_BYTES = 16 << 20  # as oci/spec.py reads a spec
CONTAINERD_TASKS = "io.containerd.runtime.v2.task"  # containerd's bundles: .../io.containerd.runtime.v2.task/NS/ID
RECORD_VERSION = 1  # node/container_record.py
# A container without a GPU is recorded (and so drained by gpuckptd) when its owner asks:
# it is the owner's own container that gets checkpointed through its own engine.
INVENTORY_ANNOTATION = "io.gpuckpt.inventory"
OPTION_PREFIX, MAX_OPTIONS = "io.gpuckpt.", 16  # what of a container's annotations its record keeps


class HookError(GpuckptError):
    """What the hook refuses; the engine shows the line."""


def _object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise HookError(f"{what} is not a JSON object")
    return value


def read_state(data: bytes) -> tuple[str, str, int, dict[str, object]]:
    """id, bundle, pid and annotations of the OCI state the engine passed on stdin."""
    if len(data) > MAX_STATE_BYTES:
        raise HookError(f"the container state on stdin is larger than {MAX_STATE_BYTES} bytes")
    try:
        state = _object(json.loads(data), "the container state on stdin")
    except (ValueError, UnicodeDecodeError) as error:
        raise HookError(f"the container state on stdin is not JSON: {error}") from None
    container_id = check_container_id(state.get("id"))
    bundle, pid = state.get("bundle"), state.get("pid", 0)
    if not isinstance(bundle, str) or not bundle.startswith("/") or "\0" in bundle:
        raise HookError(f"container {container_id}: bundle {bundle!r} is not an absolute path")
    if not isinstance(pid, int) or pid < 0:
        raise HookError(f"container {container_id}: pid {pid!r} is not a process id")
    annotations = state.get("annotations") or {}
    return container_id, bundle, pid, _object(annotations, "the state's annotations")


def _entries(spec: dict[str, object], section: str, key: str) -> list[dict[str, object]]:
    """spec[section][key] when it is a list of objects; [] when absent (runc refuses a malformed spec itself)."""
    if section:
        part = spec.get(section)
        spec = part if isinstance(part, dict) else {}
    entries = spec.get(key)
    return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def gpu_minors(spec: dict[str, object]) -> set[int]:
    """The minors of the /dev/nvidiaN the spec gives: device nodes, or device files bind-mounted in."""
    paths = [device.get("path") for device in _entries(spec, "linux", "devices")]
    paths += [mount.get("destination") for mount in _entries(spec, "", "mounts")]
    return {minor for path in paths if isinstance(path, str) and (minor := gpu_minor(path)) is not None}


def visible_devices(spec: dict[str, object]) -> str | None:
    """NVIDIA_VISIBLE_DEVICES of the process, unless it asks for none (the NVIDIA toolkit's variable)."""
    process = spec.get("process")
    env = process.get("env") if isinstance(process, dict) else None
    for entry in env if isinstance(env, list) else []:
        if isinstance(entry, str) and entry.startswith("NVIDIA_VISIBLE_DEVICES="):
            value = entry.partition("=")[2][:MAX_VISIBLE_DEVICES]
            return value if value and value not in ("void", "none") else None
    return None


def options(annotations: dict[str, object]) -> dict[str, str]:
    """The container's io.gpuckpt.* annotations, as many and as long as a record holds; printable ASCII
    only, so that JSON's escapes cannot grow a record past node/inventory.py's bound."""
    kept = [(key, value) for key, value in annotations.items()
            if key.startswith(OPTION_PREFIX) and isinstance(value, str) and len(key) <= 128 and len(value) <= 256
            and (key + value).isascii() and (key + value).isprintable()]
    return dict(sorted(kept)[:MAX_OPTIONS])


def engine_of(bundle: str, annotations: dict[str, object]) -> str:
    """The engine that made the container: from where its bundle is (the engine's choice), then its annotations."""
    parts = bundle.split("/")
    if CONTAINERD_TASKS in parts[:-2]:
        return "docker" if parts[parts.index(CONTAINERD_TASKS) + 1] == "moby" else "containerd"
    if "io.kubernetes.cri-o.ContainerType" in annotations:
        return "cri-o"  # CRI-O's own key (podman sets other io.kubernetes.cri-o.* keys, not this one)
    # containers/storage's layout (DRIVER-containers/ID/userdata), where podman's bundles are: the
    # engine's choice, where io.container.manager is one a user's --annotation overrides
    if in_containers_storage(bundle):
        return "podman"
    if annotations.get("io.container.manager") == "libpod":
        return "podman"
    return "runc"


def created(state: bytes) -> None:
    container_id, bundle, pid, annotations = read_state(state)
    try:
        spec = _object(json.loads(read_bounded(os.path.join(bundle, "config.json"), MAX_SPEC_BYTES,
                                               f"container {container_id}: config.json")), "config.json")
    except ValueError as error:
        raise HookError(f"container {container_id}: config.json is not JSON: {error}") from None
    if pid and own_network_namespace(spec):
        loopback_for_restore(container_id, pid)
    minors, visible = gpu_minors(spec), visible_devices(spec)
    if not minors and visible is None and annotations.get(INVENTORY_ANNOTATION) != "true":
        return  # not a GPU container, and not one its owner asked to be drained with them
    listed = gpu_uuids_by_minor()
    if minors and listed is None:
        raise HookError(f"container {container_id} is given /dev/nvidia{min(minors)} but this node has no "
                        f"NVIDIA GPU ({nvidia_proc()}/gpus is missing: driver not loaded)")
    node = listed or {}
    missing = sorted(minors - set(node))
    if missing:
        here = ", ".join(f"/dev/nvidia{minor}" for minor in sorted(node)) or "none"
        raise HookError(f"container {container_id} is given /dev/nvidia{missing[0]} but this node has no such GPU "
                        f"(GPUs here: {here})")
    write_record({
        "version": RECORD_VERSION, "id": container_id, "engine": engine_of(bundle, annotations), "bundle": bundle,
        "pid": pid, "gpus": [{"minor": minor, "uuid": node[minor]} for minor in sorted(minors)],
        "visible_devices": None if minors else visible, "created": utc_now(), "options": options(annotations),
    })


def own_network_namespace(spec: dict[str, object]) -> bool:
    """Whether the runtime makes the container a network namespace (one without a path: not the host's, not a
    pod's or an engine's it joins)."""
    return any(entry.get("type") == "network" and not entry.get("path")
               for entry in _entries(spec, "linux", "namespaces"))


def loopback_for_restore(container_id: str, pid: int) -> None:
    """`lo` up in the network namespace of the container's first process, which runc made (see the module's
    text). A failure is said and the hook goes on: runc's create sets `lo` up itself, and a restore with
    loopback connections then fails in CRIU's words."""
    try:
        in_netns_of(pid, loopback_up)
    except OSError as error:
        sys.stderr.write(f"gpuckpt-hook: container {container_id}: lo of its network namespace left as it is: "
                         f"{error}\n")


def stopped(state: bytes) -> None:
    container_id, bundle, _, _ = read_state(state)
    remove_record(container_id, bundle)


def node_root() -> bool:
    """Whether this is the node's root: not root in a user namespace (rootless podman runs hooks as
    its user, who has no part in the node's inventory)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map") as uid_map:
            return uid_map.read().split() == ["0", "0", "4294967295"]
    except OSError:
        return False


def build_parser() -> argparse.ArgumentParser:
    """gpuckpt-hook's command line, for --help and its manual page (cli/manual.py)."""
    import argparse  # deferred: every container's create runs the hook, which never parses with it

    parser = argparse.ArgumentParser(
        prog="gpuckpt-hook",
        description="The OCI hook that keeps the node's inventory of GPU containers (the containers gpuckptd drains "
                    "and checkpoints). Engines run it from its hooks.d file with the container's state on stdin: at "
                    "createRuntime a container given NVIDIA GPUs (or annotated io.gpuckpt.inventory=true) is "
                    "recorded, and one asking for a GPU this node does not have is refused before its process "
                    "runs; at poststop its record goes.")
    parser.add_argument("stage", choices=STAGES, help="the OCI hook stage it runs at")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):  # its manual page lists --help
        build_parser().print_help()
        return 0
    if len(argv) != 1 or argv[0] not in STAGES:
        sys.stderr.write(f"gpuckpt-hook: usage: gpuckpt-hook {'|'.join(STAGES)} (the OCI state on stdin), "
                         f"got {' '.join(argv) or 'nothing'}\n")
        return 2
    if not node_root():
        return 0  # a rootless engine's container: not the node's to record
    try:
        (created if argv[0] == "createRuntime" else stopped)(sys.stdin.buffer.read(MAX_STATE_BYTES + 1))
    except (GpuckptError, OSError) as error:
        sys.stderr.write(f"gpuckpt-hook: {error}\n")
        return 1
    except RecursionError:
        sys.stderr.write("gpuckpt-hook: the container state or config.json nests too deep to read\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
