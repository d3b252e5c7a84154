"""Test helper: CRIU image files written with CRIU's own messages, and the real dump they start from."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

from gpuckpt.oci.criu_images import criu_messages
from gpuckpt.policy.image import SpecGrant

REAL_DUMP = Path(__file__).parent / "data" / "criu-podman-default"  # podman 4.3 + runc + CRIU 4.2.1, `sleep`
DEFAULT_CAPS = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 31})  # podman's eleven


class ImageBuilder:
    """CRIU image files written with CRIU's own messages: magic(s), then (u32 size, message) entries."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.pb = directory, criu_messages()
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, kind: str, *entries, common: bool = True) -> Path:
        magic = self.pb.magic
        head = struct.pack("<I", magic[kind]) if kind == "INVENTORY" or not common else \
            struct.pack("<II", magic["IMG_COMMON"], magic[kind])
        body = b"".join(struct.pack("<I", len(raw)) + raw for raw in (entry.SerializeToString() for entry in entries))
        path = self.dir / name
        path.write_bytes(head + body)
        return path

    def ids(self, base: int = 0, **override):
        ids = self.pb.ids(**{f"{kind}_ns_id": base + number for number, kind in
                             enumerate(("pid", "net", "ipc", "uts", "mnt", "user", "cgroup", "time"), 1)},
                           vm_id=base + 20, files_id=base + 21, fs_id=base + 22, sighand_id=base + 23)
        for key, value in override.items():
            setattr(ids, f"{key}_ns_id", value)
        return ids

    def creds(self, caps=DEFAULT_CAPS, uid: int = 0, gid: int = 0, **fields):
        words = [sum(1 << (cap - 32 * word) for cap in caps if cap // 32 == word) for word in (0, 1)]
        values = dict(uid=uid, gid=gid, euid=uid, egid=gid, suid=uid, sgid=gid, fsuid=uid, fsgid=gid,
                      cap_inh=[0, 0], cap_prm=words, cap_eff=words, cap_bnd=words, secbits=0)
        values.update(fields)
        return self.pb.creds(**values)

    def core(self, creds=None, seccomp_mode: int | None = None, seccomp_filter: int | None = None,
             state: int = 1, ids=None, thread_core: bool = True, comm: str = "sleep"):
        core = self.pb.core(mtype=1)
        core.tc.task_state, core.tc.exit_code, core.tc.personality, core.tc.flags = state, 0, 0, 0
        core.tc.blk_sigset, core.tc.comm = 0, comm
        if ids is not None:
            core.ids.CopyFrom(ids)
        if thread_core:
            core.thread_core.futex_rla, core.thread_core.futex_rla_len = 0, 0
            core.thread_core.creds.CopyFrom(creds if creds is not None else self.creds())
            if seccomp_mode is not None:
                core.thread_core.seccomp_mode = seccomp_mode
            if seccomp_filter is not None:
                core.thread_core.seccomp_filter = seccomp_filter
        return core

    def checkpoint(self, creds=None, threads=(), seccomp: bool = True, task_ids=None):
        """One task (pid 1, with `threads` more), in namespaces of its own, under one filter."""
        self.write("inventory.img", "INVENTORY", self.pb.inventory(img_version=2, root_ids=self.ids()))
        self.write("pstree.img", "PSTREE", self.pb.pstree(pid=1, ppid=0, pgid=1, sid=1, threads=[1, *threads]))
        self.write("ids-1.img", "IDS", task_ids if task_ids is not None else self.ids(100, user=6))
        mode = (2, 0) if seccomp else (None, None)
        for tid in (1, *threads):
            self.write(f"core-{tid}.img", "CORE", self.core(creds, *mode))
        if seccomp:  # podman's default filter, as runc compiled it (filter 0)
            (self.dir / "seccomp.img").write_bytes((REAL_DUMP / "seccomp.img").read_bytes())
        return self.dir

    def filter(self, program: bytes, prev: int | None = None):
        entry_type = self.pb.seccomp.DESCRIPTOR.fields_by_name["seccomp_filters"].message_type._concrete_class
        return entry_type(filter=program) if prev is None else entry_type(filter=program, prev=prev)


BASE_SPEC = json.loads((REAL_DUMP / "config.json").read_text())  # podman's default spec (root, 11 caps, seccomp)


def spec(**changes) -> SpecGrant:
    """podman's default spec with `changes` applied: process_* to process, linux_* to linux."""
    raw = copy.deepcopy(BASE_SPEC)
    for key, value in changes.items():
        part, _, field = key.partition("_")
        if value is None:
            raw[part].pop(field, None)
        else:
            raw[part][field] = value
    return SpecGrant.model_validate(raw)
