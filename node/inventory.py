"""The node's GPU containers: one record each in /run/gpuckpt/containers/ID.json.

gpuckpt-hook writes a record when a GPU container is created and removes it when the
container is gone; the node service reads them (node/container_record.py is the format).
Stdlib only: the hook runs on every container start. The directory is root's and written
through descriptors: a record lands whole (written beside, then renamed) whatever other
hooks run at the same time, and no name in it is ever followed through a link.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable

from ..errors import GpuckptError
from ..host.safefiles import make_directories, write_private_at
from .container_record import ContainerRecord, parse_record
from .paths import state_dir

INVENTORY_DIR = "containers"
RECORD_SUFFIX = ".json"
MAX_RECORD_BYTES = 64 << 10
# runc's container id rule ([\w+.-]+), less what cannot be a file name of its own here.
# not '-' first: an id becomes an engine's argument
CONTAINER_ID = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_+.-]{0,199}", re.ASCII)  # fullmatch: no trailing newline


class InventoryError(GpuckptError):
    """The inventory directory cannot be used safely."""


# Moves the inventory alone: a test's gpuckptd reads one of its own while the engines it calls use the node's state.
INVENTORY_DIR_ENV = "GPUCKPT_INVENTORY_DIR"


def inventory_dir() -> str:
    return os.environ.get(INVENTORY_DIR_ENV) or os.path.join(state_dir(), INVENTORY_DIR)


def check_container_id(container_id: object) -> str:
    if not isinstance(container_id, str) or not CONTAINER_ID.fullmatch(container_id):
        raise InventoryError(f"container id {container_id!r} not allowed: letters, digits, '_', '+', '-', '.' "
                             "('-' and '.' not first), at most 200")
    return container_id


def _open_inventory() -> int:
    """The inventory directory's descriptor, made root-only if missing; refused if anyone else can write it."""
    parent_fd, fd, _ = make_directories(inventory_dir(), 0o700)
    os.close(parent_fd)
    status = os.fstat(fd)
    if status.st_uid != os.geteuid() or status.st_mode & 0o022 or not stat.S_ISDIR(status.st_mode):
        os.close(fd)
        raise InventoryError(f"{inventory_dir()} is not a directory only {os.geteuid()} can write; refusing to use it")
    return fd


def write_record(record: dict[str, object]) -> None:
    """Record a container (replacing its earlier record, if any) at once for every reader."""
    container_id = check_container_id(record.get("id"))
    data = json.dumps(record, sort_keys=True).encode()
    fd = _open_inventory()
    try:
        temporary = f".{container_id}.{os.getpid()}.tmp"
        write_private_at(fd, temporary, data)
        os.replace(temporary, container_id + RECORD_SUFFIX, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def remove_record(container_id: str, bundle: str) -> bool:
    """Forget a container; whether there was a record. Only the record of this bundle goes: an id is
    one engine's (or one containerd namespace's), and another's container may hold the same."""
    check_container_id(container_id)
    if not os.path.isdir(inventory_dir()):
        return False  # nothing recorded, and nothing to make
    fd = _open_inventory()
    try:
        data = _read_record(fd, container_id + RECORD_SUFFIX)
        try:
            recorded_bundle = json.loads(data).get("bundle") if data is not None else None
        except (ValueError, AttributeError):
            recorded_bundle = None  # a damaged or unreadable record: its id is all it has
        if recorded_bundle not in (None, bundle):
            return False
        os.unlink(container_id + RECORD_SUFFIX, dir_fd=fd)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


def _read_record(dir_fd: int, name: str) -> bytes | None:
    """A record's bytes: a regular file of at most MAX_RECORD_BYTES; None for anything else or gone."""
    try:
        record_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None  # gone meanwhile (its container ended), a link, a socket
    try:
        if not stat.S_ISREG(os.fstat(record_fd).st_mode):
            return None
        data = os.read(record_fd, MAX_RECORD_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(record_fd)
    return data if len(data) <= MAX_RECORD_BYTES else None


def read_records() -> dict[str, bytes]:
    """Every record's bytes by container id (a regular file each, at most MAX_RECORD_BYTES; others skipped)."""
    fd = _open_inventory()
    records: dict[str, bytes] = {}
    try:
        for name in os.listdir(fd):
            container_id = name.removesuffix(RECORD_SUFFIX)
            if name.startswith(".") or not name.endswith(RECORD_SUFFIX) or not CONTAINER_ID.fullmatch(container_id):
                continue
            data = _read_record(fd, name)
            if data is not None:
                records[container_id] = data
    finally:
        os.close(fd)
    return records


def recorded_containers(report: Callable[[str, str], None]) -> list[ContainerRecord]:
    """The inventory's containers; a record that does not parse is reported (`report(message, container_id)`) and
    left out."""
    found = []
    for container_id, data in sorted(read_records().items()):
        try:
            found.append(parse_record(data, f"inventory record {container_id}"))
        except GpuckptError as error:
            report(str(error), container_id)
    return found
