"""podman's record of a container it restores (host/podman_state.py): the network namespace it made and its pod's
infra process, read from podman 4's BoltDB (bbolt's page layout, written here byte by byte) and podman 5's SQLite
(its schema's tables), never from config.dump."""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

import pytest

from gpuckpt.errors import ImageError
from gpuckpt.host.podman_state import PodmanRecord, podman_record

PAGE = 4096
CTR, INFRA, POD, OTHER = "c" * 64, "i" * 64, "p" * 64, "o" * 64
NETNS = "/run/netns/netns-6f1c1a8e-1d3c-5b2a-9a7e-0c4b9d2e1f00"


def _fnv64a(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def _leaf(items: list[tuple[bytes, bytes, int]], page_id: int = 0) -> bytes:
    """A bbolt leaf page: header, 16-byte elements, then each key and value; `pos` counts from the element."""
    items = sorted(items)
    header = struct.pack("<QHHI", page_id, 0x02, len(items), 0)
    data, elements = b"", b""
    for n, (key, value, flags) in enumerate(items):
        pos = 16 * (len(items) - n) + len(data)
        elements += struct.pack("<IIII", flags, pos, len(key), len(value))
        data += key + value
    return header + elements + data


def _inline(items: list[tuple[bytes, bytes, int]]) -> bytes:
    return struct.pack("<QQ", 0, 0) + _leaf(items)  # root 0: the bucket's page follows its header


def _branch_of(children: list[tuple[bytes, int]], page_id: int) -> bytes:
    header = struct.pack("<QHHI", page_id, 0x01, len(children), 0)
    data, elements = b"", b""
    for n, (key, child) in enumerate(children):
        elements += struct.pack("<IIQ", 16 * (len(children) - n) + len(data), len(key), child)
        data += key
    return header + elements + data


def _meta(page_id: int, txid: int, root: int) -> bytes:
    body = struct.pack("<IIIIQQQQQ", 0xED0CDAED, 2, PAGE, 0, root, 0, 2, 6, txid)
    return (struct.pack("<QHHI", page_id, 0x04, 0, 0) + body + struct.pack("<Q", _fnv64a(body))).ljust(PAGE, b"\0")


def write_bolt(path: Path, infra_pid: int = 4242) -> None:
    """podman 4.3.1's buckets: ctr/ID {config, state, netns}, pod/ID {state}; the ctr bucket on its own pages
    under a branch page, as a database of many containers has it."""
    def container(config: dict, state: dict, netns: str = "") -> bytes:
        items = [(b"config", json.dumps(config).encode(), 0), (b"state", json.dumps(state).encode(), 0)]
        return _inline(items + ([(b"netns", netns.encode(), 0)] if netns else []))
    ctrs = [(CTR.encode(), container({"pod": POD}, {"pid": 0}, NETNS), 1),
            (INFRA.encode(), container({"pod": POD}, {"pid": infra_pid}), 1),
            (OTHER.encode(), container({}, {"pid": 77}, "/run/netns/netns-other"), 1)]
    ctrs.sort()
    pages = {3: _leaf(ctrs[:1], 3), 4: _leaf(ctrs[1:], 4)}
    pages[5] = _branch_of([(ctrs[0][0], 3), (ctrs[1][0], 4)], 5)
    pod = _inline([(b"state", json.dumps({"InfraContainerID": INFRA}).encode(), 0)])
    root = _leaf([(b"ctr", struct.pack("<QQ", 5, 0), 1), (b"pod", _inline([(POD.encode(), pod, 1)]), 1)], 2)
    image = _meta(0, 7, 2) + _meta(1, 6, 99)  # the newer meta (txid 7) is the one read; the older names garbage
    image += b"".join(page.ljust(PAGE, b"\0") for _, page in sorted({2: root, **pages}.items()))
    (path / "libpod").mkdir(parents=True, exist_ok=True)
    (path / "libpod" / "bolt_state.db").write_bytes(image)


def test_podman_4s_boltdb_names_the_netns_it_made_and_the_pods_infra(tmp_path):
    write_bolt(tmp_path)
    assert podman_record(str(tmp_path), str(tmp_path / "run"), CTR) == PodmanRecord(NETNS, 4242)
    assert podman_record(str(tmp_path), str(tmp_path / "run"), OTHER) == PodmanRecord("/run/netns/netns-other", 0)
    with pytest.raises(ImageError, match="no container"):
        podman_record(str(tmp_path), str(tmp_path / "run"), "d" * 64)


def test_a_damaged_boltdb_is_refused_not_guessed(tmp_path):
    write_bolt(tmp_path)
    db = tmp_path / "libpod" / "bolt_state.db"
    data = bytearray(db.read_bytes())
    data[16 + 60] ^= 0xFF  # both metas' checksums broken
    data[PAGE + 16 + 60] ^= 0xFF
    db.write_bytes(bytes(data))
    with pytest.raises(ImageError, match="not a BoltDB file this reads"):
        podman_record(str(tmp_path), str(tmp_path / "run"), CTR)


def test_podman_5s_sqlite_names_the_netns_it_made_and_the_pods_infra(tmp_path):
    (tmp_path / "libpod").mkdir()
    with sqlite3.connect(tmp_path / "libpod" / "db.sql") as db:
        db.executescript("""CREATE TABLE ContainerConfig(ID TEXT PRIMARY KEY NOT NULL, Name TEXT UNIQUE NOT NULL,
                              PodID TEXT, JSON TEXT NOT NULL);
                            CREATE TABLE ContainerState(ID TEXT PRIMARY KEY NOT NULL, State INTEGER NOT NULL,
                              ExitCode INTEGER, JSON TEXT NOT NULL);
                            CREATE TABLE PodState(ID TEXT PRIMARY KEY NOT NULL, InfraContainerID TEXT,
                              JSON TEXT NOT NULL);""")
        db.executemany("INSERT INTO ContainerConfig VALUES (?, ?, ?, '{}')", [(CTR, "a", POD), (INFRA, "b", POD)])
        db.executemany("INSERT INTO ContainerState VALUES (?, 3, 0, ?)",
                       [(CTR, json.dumps({"netns": NETNS})), (INFRA, json.dumps({"pid": 31}))])
        db.execute("INSERT INTO PodState VALUES (?, ?, '{}')", (POD, INFRA))
    assert podman_record(str(tmp_path), str(tmp_path / "run"), CTR) == PodmanRecord(NETNS, 31)
    assert podman_record(str(tmp_path), str(tmp_path / "run"), INFRA) == PodmanRecord("", 31)


def test_no_podman_database_is_no_record(tmp_path):
    assert podman_record(str(tmp_path), str(tmp_path / "run"), CTR) is None
