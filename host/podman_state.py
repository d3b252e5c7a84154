"""What podman's own database says of a container it is restoring: the network namespace it made for it, and the
process of the infra container of its pod.

podman (4.3.1, `libpod/container_internal_linux.go` prepare) makes the container's network namespace and saves the
path in its state before it calls the runtime to restore; a restore into a pod (`--pod`, which podman's --import
requires for a pod's container and takes from the operator, not config.dump) joins the namespaces of the pod's
infra container as /proc/INFRA_PID/ns/TYPE. podman 4 keeps its state in BoltDB (GRAPHROOT/libpod/bolt_state.db:
bucket ctr/ID, keys config, state, netns; pod/ID/state InfraContainerID), podman 5 in SQLite (db.sql:
ContainerConfig, ContainerState JSON "netns", PodState InfraContainerID). Read only: a shared lock on the BoltDB
file (podman holds an exclusive one while it writes), SQLite opened read-only. The BoltDB reader is ours: PyPI
has no maintained one (`boltdb` 0.0.2 is an unreleased port), and the three lookups need a page walk of ~80 lines.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import struct
import time
from dataclasses import dataclass

from ..errors import ImageError

MAX_DB_BYTES = 256 << 20
LOCK_WAIT_S = 10.0
BOLT_MAGIC = 0xED0CDAED
BRANCH, LEAF = 0x01, 0x02
BUCKET_LEAF = 0x01
MAX_DEPTH = 32


@dataclass(frozen=True)
class PodmanRecord:
    netns: str  # the network namespace path podman made for the container, "" if it made none
    infra_pid: int  # the process of its pod's infra container, 0 if no pod (or the infra is not running)


def podman_record(graph_root: str, run_root: str, container_id: str) -> PodmanRecord | None:
    """podman's record of `container_id` under these storage roots; None where no podman database is there.
    A database that is there but unreadable, or without the container, raises ImageError."""
    for path in (f"{graph_root}/libpod/db.sql", f"{run_root}/db.sql", f"{graph_root}/db.sql"):
        if os.path.isfile(path):
            return _sqlite_record(path, container_id)
    bolt = f"{graph_root}/libpod/bolt_state.db"
    if os.path.isfile(bolt):
        return _bolt_record(bolt, container_id)
    return None


def _sqlite_record(path: str, container_id: str) -> PodmanRecord:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=LOCK_WAIT_S) as db:
            row = db.execute("SELECT c.PodID, s.JSON FROM ContainerConfig c JOIN ContainerState s ON s.ID = c.ID "
                             "WHERE c.ID = ?", (container_id,)).fetchone()
            if row is None:
                raise ImageError(f"podman's database {path}: no container {container_id[:64]}")
            pod, state = row[0] or "", _json(row[1], path)
            infra = ""
            if pod and (found := db.execute("SELECT InfraContainerID FROM PodState WHERE ID = ?", (pod,)).fetchone()):
                infra = found[0] or ""
            infra_state = db.execute("SELECT JSON FROM ContainerState WHERE ID = ?", (infra,)).fetchone() \
                if infra else None
    except sqlite3.Error as error:
        raise ImageError(f"podman's database {path}: cannot read: {error}") from None
    return PodmanRecord(_text(state.get("netns")), _pid(_json(infra_state[0], path) if infra_state else {}))


def _bolt_record(path: str, container_id: str) -> PodmanRecord:
    data = _read_locked(path)
    try:
        bolt = _Bolt(data)
        container = bolt.bucket(bolt.root, b"ctr", container_id.encode())
        if container is None:
            raise ImageError(f"podman's database {path}: no container {container_id[:64]}")
        netns = (bolt.get(container, b"netns") or b"").decode("utf-8", "replace")
        pod = _text(_json(bolt.get(container, b"config") or b"{}", path).get("pod"))
        infra_pid = 0
        if pod and (pod_bucket := bolt.bucket(bolt.root, b"pod", pod.encode())) is not None:
            infra = _text(_json(bolt.get(pod_bucket, b"state") or b"{}", path).get("InfraContainerID"))
            if infra and (infra_bucket := bolt.bucket(bolt.root, b"ctr", infra.encode())) is not None:
                infra_pid = _pid(_json(bolt.get(infra_bucket, b"state") or b"{}", path))
    except (struct.error, IndexError, ValueError) as error:
        raise ImageError(f"podman's database {path}: not a BoltDB file this reads ({error})") from None
    return PodmanRecord(netns, infra_pid)


def _read_locked(path: str) -> bytes:
    """The file's bytes under a shared flock: bbolt takes an exclusive one for as long as a podman has it open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise ImageError(f"podman's database {path}: cannot read: {error.strerror}") from None
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ImageError(f"podman's database {path}: still locked after {LOCK_WAIT_S:.0f} s") from None
                time.sleep(0.02)
        size = os.fstat(fd).st_size
        if size > MAX_DB_BYTES:
            raise ImageError(f"podman's database {path}: {size} bytes, more than {MAX_DB_BYTES} this reads")
        chunks, left = [], size
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)  # drops the lock


def _json(raw: bytes | str, path: str) -> dict[str, object]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise ImageError(f"podman's database {path}: a record that is not JSON") from None
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _pid(state: dict[str, object]) -> int:
    pid = state.get("pid")
    return pid if isinstance(pid, int) and pid > 0 else 0


class _Bolt:
    """The few reads of a BoltDB file (go.etcd.io/bbolt's layout) podman's record needs: nested buckets by key."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        page_size = struct.unpack_from("<I", data, 16 + 8)[0]
        if not 512 <= page_size <= 1 << 16:
            raise ValueError(f"page size {page_size}")
        metas = [meta for meta in (self._meta(0), self._meta(page_size)) if meta]
        if not metas:
            raise ValueError("no valid meta page")
        self.page_size = page_size
        self.root: tuple[bytes, int] = (data, max(metas)[1] * page_size)  # the newest committed transaction's

    def _meta(self, at: int) -> tuple[int, int] | None:
        magic, version, _, _, root = struct.unpack_from("<IIIIQ", self.data, at + 16)
        txid, checksum = struct.unpack_from("<QQ", self.data, at + 16 + 48)
        if magic != BOLT_MAGIC or version != 2 or checksum != _fnv64a(self.data[at + 16:at + 16 + 56]):
            return None
        return txid, root

    def get(self, node: tuple[bytes, int], key: bytes) -> bytes | None:
        found = self._find(node, key, 0)
        return found[1] if found and not found[0] & BUCKET_LEAF else None

    def bucket(self, node: tuple[bytes, int], *keys: bytes) -> tuple[bytes, int] | None:
        for key in keys:
            found = self._find(node, key, 0)
            if not found or not found[0] & BUCKET_LEAF:
                return None
            root = struct.unpack_from("<Q", found[1])[0]
            node = (found[1], 16) if root == 0 else (self.data, root * self.page_size)  # 0: inline after its header
        return node

    def _find(self, node: tuple[bytes, int], key: bytes, depth: int) -> tuple[int, bytes] | None:
        buf, at = node
        if depth > MAX_DEPTH:
            raise ValueError("tree too deep")
        flags, count = struct.unpack_from("<HH", buf, at + 8)
        elements = [at + 16 + 16 * n for n in range(count)]
        if flags & BRANCH:
            child = None
            for element in elements:
                pos, size, pgid = struct.unpack_from("<IIQ", buf, element)
                if child is not None and buf[element + pos:element + pos + size] > key:
                    break
                child = pgid
            return None if child is None else self._find((self.data, child * self.page_size), key, depth + 1)
        if not flags & LEAF:
            raise ValueError(f"page flags {flags:#x}")
        for element in elements:
            leaf_flags, pos, key_size, value_size = struct.unpack_from("<IIII", buf, element)
            start = element + pos
            if buf[start:start + key_size] == key:
                return leaf_flags, buf[start + key_size:start + key_size + value_size]
        return None


def _fnv64a(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value
