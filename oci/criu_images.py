"""CRIU's image files, read with bounds: what each process of a checkpoint will be restored with.

Phases: load CRIU's own message definitions (the protobuf modules of Debian's python3-pycriu,
from a root-owned directory), then read inventory.img (the dumper's namespaces), pstree.img
(tasks and their threads), each thread's core-<tid>.img (credentials, seccomp mode), each
task's ids-<pid>.img (namespaces), seccomp.img (filter chains), userns-<id>.img (user
namespace maps), mountpoints-<id>.img (the mounts CRIU makes, as root, in each mount
namespace) and cgroup.img (the cgroup directories and files CRIU makes and writes under its
cgroup yard); apart, remap-fpath.img and files.img (which link_remap name CRIU's link-remap
made for which removed name). Files come from a directory (opened without following links,
regular files only) or from an archive's entries already in memory; every file, entry and count is capped.
Any problem is one ImageError naming the file.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import stat
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType

from google.protobuf.message import DecodeError, Message

from ..errors import ImageError

# Where CRIU's python bindings are looked for: the test bed's CRIU prefix (install-system.sh),
# then a distribution's python3-pycriu. The shim runs as root and imports from there, so the
# directory and every parent must be root's and writable by no one else.
PYCRIU_DIRS = ("/opt/gpuckpt/criu/usr/lib/python3/dist-packages/pycriu/images",
               "/usr/lib/python3/dist-packages/pycriu/images")
PB2_MODULES = ("creds_pb2", "core_pb2", "pstree_pb2", "inventory_pb2", "seccomp_pb2", "userns_pb2", "cgroup_pb2",
               "mnt_pb2", "fdinfo_pb2", "remap_file_path_pb2", "regfile_pb2")

MAX_FILE_BYTES = 1 << 20         # core-N.img holds registers, sigactions, rlimits: a few KiB
MAX_SECCOMP_BYTES = 16 << 20     # every distinct filter program of the tree (4096 insns each at most)
MAX_TASKS = 32_768               # pstree entries
MAX_THREADS = 65_536             # threads of all tasks together: one core file each
MAX_FILTERS = 4_096              # seccomp filters in seccomp.img
MAX_MAP_EXTENTS = 340            # the kernel's limit for uid_map/gid_map lines
SECCOMP_FILTER_FLAG_TSYNC = 1
TASK_DEAD = 2                    # a zombie: restored only to be reaped, never runs
NAMESPACE_FIELDS = ("pid", "net", "ipc", "uts", "mnt", "user", "cgroup", "time")
IMAGE_NAME = re.compile(r"(inventory|pstree|seccomp|cgroup|(?:core|ids|userns|creds|mountpoints)-[0-9]{1,10})\.img")
MAX_CGROUP_CONTROLLERS = 64  # a kernel has about 15 v1 controllers
MAX_MOUNTS = 4_096           # mounts of one namespace (a container has a few dozen)
MAX_CGROUP_NAMES = 65_536    # cgroup directories and files of cgroup.img together
MAX_CGROUP_DEPTH = 64
MS_RDONLY = 1
MAX_FILES_BYTES = 64 << 20       # files.img: one entry (about 100 bytes, a path) per file the tree holds
MAX_FILE_ENTRIES = 1 << 20
MAX_REMAPS = 65_536              # remap-fpath.img entries: one per deleted or removed-name file held
FD_TYPE_REG = 1                  # fd_types.REG: a regular file's entry in files.img
REMAP_TYPE_LINKED = 0            # remap_type.LINKED: CRIU's link-remap (a hard link beside the removed name)
LINK_REMAP_NAME = re.compile(r"link_remap\.[0-9]{1,10}")  # criu/files-reg.c create_link_remap's "link_remap.%d"


@dataclass(frozen=True)
class Creds:
    """One thread's credentials as CRIU will set them (capability sets as bit numbers)."""

    uid: int
    gid: int
    euid: int
    egid: int
    suid: int
    sgid: int
    fsuid: int
    fsgid: int
    groups: tuple[int, ...]
    cap_inh: frozenset[int]
    cap_prm: frozenset[int]
    cap_eff: frozenset[int]
    cap_bnd: frozenset[int]
    cap_amb: frozenset[int]
    secbits: int
    no_new_privs: bool


@dataclass(frozen=True)
class ThreadImage:
    tid: int
    creds: Creds | None       # None: CRIU would leave the restorer's own (root's) credentials
    seccomp_mode: int         # 0 disabled, 1 strict, 2 filter
    seccomp_chain: tuple[int, ...] = ()  # indices into CheckpointImages.seccomp_programs, newest first

    @property
    def seccomp_filters(self) -> int:
        return len(self.seccomp_chain)


@dataclass(frozen=True)
class TaskImage:
    pid: int
    state: int
    comm: str
    threads: tuple[ThreadImage, ...]
    namespaces: tuple[dict[str, int], ...]  # from ids-<pid>.img and core's ids, each present one

    @property
    def alive(self) -> bool:
        return self.state != TASK_DEAD


@dataclass(frozen=True)
class IdMap:
    first: int        # inside the namespace
    lower_first: int  # in the parent namespace
    count: int


@dataclass(frozen=True)
class MountImage:
    """One mount CRIU will make in a restored mount namespace (mountpoints-<id>.img's mnt_entry)."""

    mountpoint: str
    fstype: int        # mnt.proto's fstype: 1 proc, 2 sysfs, 5 tmpfs, 12 cgroup, 17 overlay, ...
    root: str          # the part of its filesystem it shows (a bind of a subtree: not "/")
    read_only: bool    # MS_RDONLY in the mount's own flags (a bind gets no superblock flags: CRIU mounts
    #                    no new superblock for it, so sb_flags alone proves nothing; attack30e sbro)
    external: bool     # ext_key/ext_mount: the runtime's map names its source, not the image
    fsname: str        # the filesystem CRIU mounts by name (fstype AUTO)
    with_plugin: bool  # a CRIU plugin restores it
    ext_key: str = ""  # the runtime map's key for an external one (runc: the mountpoint; /dev/null for masks)


@dataclass(frozen=True)
class CgroupName:
    """A directory or file CRIU creates, chmods or writes under its cgroup yard (cgroup.img)."""

    controllers: str   # as /proc/self/cgroup names them
    path: str          # the directory, from the hierarchy's root (a set's path, or nested dir_names)
    name: str          # a property file in it ("" for the directory itself or a set's path)


@dataclass(frozen=True)
class LinkRemap:
    """One hard link CRIU's link-remap made for the dump: the restore links `remap_name` to
    `removed_name` again, opens it there and removes both names it made (paths in the container)."""

    remap_name: str    # "/dev/shm/link_remap.16"
    removed_name: str  # the name the processes hold the file under, removed: "/dev/shm/sem.x"


@dataclass
class CheckpointImages:
    """What a checkpoint's processes will be restored with."""

    where: str
    dumper_namespaces: dict[str, int]   # inventory root_ids: the namespaces CRIU itself was in
    arch: int = 0                       # core_entry.mtype of the first task (1: x86_64)
    seccomp_programs: list[bytes] = field(default_factory=list)  # seccomp.img's filters (BPF)
    tasks: list[TaskImage] = field(default_factory=list)
    user_namespaces: dict[int, tuple[tuple[IdMap, ...], tuple[IdMap, ...]]] = field(default_factory=dict)
    mounts: dict[int, tuple[MountImage, ...]] = field(default_factory=dict)  # mount namespace id -> its mounts
    cgroup_names: list[CgroupName] = field(default_factory=list)


@cache
def criu_messages() -> _Messages:
    """CRIU's generated message modules and magic numbers (python3-pycriu), as a namespace."""
    images_dir = next((path for path in PYCRIU_DIRS if os.path.isdir(path)), None)
    if images_dir is None:
        raise ImageError("cannot check CRIU images: CRIU's python bindings (python3-pycriu) are not installed "
                         f"(looked in {', '.join(PYCRIU_DIRS)})")
    _require_root_owned(images_dir)
    magic_spec = importlib.util.spec_from_file_location("gpuckpt_pycriu_magic", os.path.join(images_dir, "magic.py"))
    if magic_spec is None or magic_spec.loader is None:
        raise ImageError(f"cannot check CRIU images: no magic.py in {images_dir}")
    magic = importlib.util.module_from_spec(magic_spec)
    magic_spec.loader.exec_module(magic)
    # pycriu's generated modules import each other by their bare names ("import opts_pb2"); the
    # directory is on the path only while they load, after everything else.
    sys.path.append(images_dir)
    try:
        modules = {name: importlib.import_module(name) for name in PB2_MODULES}
    except Exception as error:  # noqa: BLE001 -- foreign generated code: protobuf raises TypeError, ImportError or its VersionError(Exception)
        raise ImageError(f"cannot check CRIU images: loading CRIU's message definitions from {images_dir} "
                         f"failed: {error}") from None
    finally:
        sys.path.remove(images_dir)
    return _Messages(magic.by_name, modules)


class _Messages:
    """CRIU's message classes: protobuf Messages generated at run time, so their fields are read by name."""

    def __init__(self, magic: dict[str, int], modules: dict[str, ModuleType]) -> None:
        self.magic = magic
        self.core = modules["core_pb2"].core_entry
        self.pstree = modules["pstree_pb2"].pstree_entry
        self.inventory = modules["inventory_pb2"].inventory_entry
        self.ids = modules["core_pb2"].task_kobj_ids_entry
        self.seccomp = modules["seccomp_pb2"].seccomp_entry
        self.userns = modules["userns_pb2"].userns_entry
        self.creds = modules["creds_pb2"].creds_entry
        self.cgroup = modules["cgroup_pb2"].cgroup_entry
        self.mount = modules["mnt_pb2"].mnt_entry
        self.file = modules["fdinfo_pb2"].file_entry
        self.reg_file = modules["regfile_pb2"].reg_file_entry
        self.remap = modules["remap_file_path_pb2"].remap_file_path_entry


def _require_root_owned(path: str) -> None:
    """The directory, every directory above it, and every file in it (and in its __pycache__)
    owned by root and writable by no one else: the shim imports code from there as root."""
    real = os.path.realpath(path)
    parts = real.split("/")
    checked = ["/".join(parts[:end]) or "/" for end in range(1, len(parts) + 1)]
    for directory in (real, os.path.join(real, "__pycache__")):
        if os.path.isdir(directory):
            checked += [directory] + [os.path.join(directory, name) for name in os.listdir(directory)]
    for current in checked:
        info = os.lstat(current)
        if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ImageError(f"cannot check CRIU images: {current} (CRIU's python bindings) is not owned by root "
                             "or is writable by others")


# --- the files ------------------------------------------------------------------------------

FileSource = Callable[[str, int], "bytes | None"]  # (name, limit) -> the file's bytes, None if absent


def directory_source(image_dir: str) -> FileSource:
    """Files of a checkpoint directory: no link followed, regular files only, at most `limit` bytes."""
    try:
        dir_fd = os.open(image_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise ImageError(f"{image_dir}: cannot open the checkpoint directory: {error.strerror}") from None
    os.close(dir_fd)

    def read(name: str, limit: int) -> bytes | None:
        where = os.path.join(image_dir, name)
        try:
            directory = os.open(image_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            raise ImageError(f"{image_dir}: cannot open the checkpoint directory: {error.strerror}") from None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise ImageError(f"{where}: cannot read: {error.strerror}") from None
        finally:
            os.close(directory)
        with os.fdopen(fd, "rb", buffering=0) as image:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ImageError(f"{where}: not a regular file")
            if info.st_size > limit:
                raise ImageError(f"{where}: {info.st_size} bytes, more than the {limit} a CRIU image of it may hold")
            data = image.read(limit + 1)
        if len(data) > limit:
            raise ImageError(f"{where}: more than the {limit} bytes a CRIU image of it may hold")
        return data

    return read


def mapping_source(files: Mapping[str, bytes]) -> FileSource:
    """Files already read (an archive's checkpoint entries), with the same limits."""

    def read(name: str, limit: int) -> bytes | None:
        data = files.get(name)
        if data is not None and len(data) > limit:
            raise ImageError(f"{name}: {len(data)} bytes, more than the {limit} a CRIU image of it may hold")
        return data

    return read


def wanted_image(name: str) -> bool:
    """Whether a checkpoint file is one of those this module reads (for archive readers)."""
    return IMAGE_NAME.fullmatch(name) is not None


def image_limit(name: str) -> int:
    return MAX_SECCOMP_BYTES if name == "seccomp.img" else MAX_FILE_BYTES


# --- the entries ------------------------------------------------------------------------------


def _entries(data: bytes, where: str, kind: str, message: type[Message], messages: _Messages, *,
             limit: int) -> list[Message]:
    """An image file's protobuf entries: magic(s), then (u32 size, message) up to `limit` of them."""
    expected = messages.magic[kind]
    if len(data) < 4:
        raise ImageError(f"{where}: not a CRIU image (shorter than its magic)")
    (first,) = struct.unpack_from("<I", data, 0)
    offset = 4
    if first in (messages.magic["IMG_COMMON"], messages.magic["IMG_SERVICE"]) and kind != "INVENTORY":
        if len(data) < 8:
            raise ImageError(f"{where}: not a CRIU image (shorter than its magic)")
        (first,) = struct.unpack_from("<I", data, 4)
        offset = 8
    if first != expected:
        raise ImageError(f"{where}: not a CRIU {kind} image (magic {first:#x})")
    entries: list[Message] = []
    while offset < len(data):
        if len(entries) >= limit:
            raise ImageError(f"{where}: more than {limit} entries")
        if offset + 4 > len(data):
            raise ImageError(f"{where}: truncated entry header at byte {offset}")
        (size,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if size > len(data) - offset:
            raise ImageError(f"{where}: entry of {size} bytes at byte {offset - 4} runs past the end of the file")
        entry = message()
        try:
            entry.ParseFromString(data[offset:offset + size])
        except (DecodeError, ValueError, RuntimeError, OverflowError) as error:
            raise ImageError(f"{where}: entry at byte {offset - 4} is not a valid {kind} message: "
                             f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
        entries.append(entry)
        offset += size
    return entries


def _one(data: bytes | None, where: str, kind: str, message: type[Message], messages: _Messages) -> Message:
    if data is None:
        raise ImageError(f"{where}: missing")
    entries = _entries(data, where, kind, message, messages, limit=1)
    if not entries:
        raise ImageError(f"{where}: holds no entry")
    return entries[0]


def _optional(data: bytes | None, where: str, kind: str, message: type[Message],
              messages: _Messages) -> Message | None:
    """The file's one entry, None if there is no such file."""
    return None if data is None else _one(data, where, kind, message, messages)


def _caps(words: Sequence[int], where: str, name: str) -> frozenset[int]:
    if len(words) > 4:
        raise ImageError(f"{where}: {name} has {len(words)} words, more than a capability set holds")
    return frozenset(index * 32 + bit for index, word in enumerate(words) for bit in range(32) if word >> bit & 1)


def _creds(entry: Message, where: str) -> Creds:
    if len(entry.groups) > 65_536:
        raise ImageError(f"{where}: {len(entry.groups)} supplementary groups, more than the kernel allows")
    return Creds(entry.uid, entry.gid, entry.euid, entry.egid, entry.suid, entry.sgid, entry.fsuid, entry.fsgid,
                 tuple(entry.groups), _caps(entry.cap_inh, where, "cap_inh"), _caps(entry.cap_prm, where, "cap_prm"),
                 _caps(entry.cap_eff, where, "cap_eff"), _caps(entry.cap_bnd, where, "cap_bnd"),
                 _caps(entry.cap_amb, where, "cap_amb"), entry.secbits, bool(entry.no_new_privs))


def _namespaces(ids: Message) -> dict[str, int]:
    return {kind: getattr(ids, f"{kind}_ns_id") for kind in NAMESPACE_FIELDS}


def _filter_chain(index: int, filters: list[Message], where: str) -> tuple[int, ...]:
    """The filters a thread runs under, newest first, following `prev` links (each checked, no loops)."""
    seen: dict[int, None] = {}
    while True:
        if index >= len(filters):
            raise ImageError(f"{where}: seccomp filter index {index}, but seccomp.img holds {len(filters)}")
        if index in seen:
            raise ImageError(f"{where}: seccomp filter chain loops at index {index}")
        seen[index] = None
        program = filters[index]
        if not program.filter or len(program.filter) % 8:
            raise ImageError(f"{where}: seccomp filter {index} is not a BPF program ({len(program.filter)} bytes)")
        if not program.HasField("prev"):
            return tuple(seen)
        index = program.prev


def read_checkpoint_images(read: FileSource, where: str) -> CheckpointImages:
    """Every task of a checkpoint with its threads' credentials, seccomp and namespaces."""
    messages = criu_messages()

    def at(name: str) -> str:
        return f"{where}/{name}"

    inventory = _one(read("inventory.img", MAX_FILE_BYTES), at("inventory.img"), "INVENTORY",
                     messages.inventory, messages)
    if not inventory.HasField("root_ids"):
        raise ImageError(f"{at('inventory.img')}: no root_ids (CRIU refuses such an image as corrupt)")
    images = CheckpointImages(where, _namespaces(inventory.root_ids))
    pstree_data = read("pstree.img", MAX_FILE_BYTES)
    if pstree_data is None:
        raise ImageError(f"{at('pstree.img')}: missing")
    tree = _entries(pstree_data, at("pstree.img"), "PSTREE", messages.pstree, messages, limit=MAX_TASKS)
    if not tree:
        raise ImageError(f"{at('pstree.img')}: holds no process")
    seccomp_entry = _optional(read("seccomp.img", MAX_SECCOMP_BYTES), at("seccomp.img"), "SECCOMP",
                              messages.seccomp, messages)
    filters = list(seccomp_entry.seccomp_filters) if seccomp_entry is not None else []
    if len(filters) > MAX_FILTERS:
        raise ImageError(f"{at('seccomp.img')}: {len(filters)} filters, more than {MAX_FILTERS}")
    images.seccomp_programs = [bytes(program.filter) for program in filters]
    threads_seen = 0
    for process in tree:
        tids = list(process.threads) or [process.pid]
        threads_seen += len(tids)
        if threads_seen > MAX_THREADS:
            raise ImageError(f"{at('pstree.img')}: more than {MAX_THREADS} threads")
        if _is_zombie(read, process.pid, at, messages):
            # CRIU restores a zombie from its own core-<pid>.img alone (cr-restore.c fork_with_pid, then
            # restore_one_zombie: no thread's core is opened), and dumps one whose thread ids it may never have
            # read (a task that ended mid-dump): its listed threads are not looked for.
            tids = [process.pid]
        images.tasks.append(_task(read, at, messages, images, pid=process.pid, tids=tids, filters=filters))
    _read_user_namespaces(read, images, messages, at)
    _read_mounts(read, images, messages, at)
    images.cgroup_names = _cgroup_names(read, messages, at("cgroup.img"))
    return images


def _task(read: FileSource, at: Callable[[str], str], messages: _Messages, images: CheckpointImages, *, pid: int,
          tids: list[int], filters: list[Message]) -> TaskImage:
    """One task of the tree: its threads' cores (the architecture noted in `images`), credentials, seccomp and
    namespaces."""
    state, comm = 0, ""
    threads: list[ThreadImage] = []
    namespaces: list[dict[str, int]] = []
    old_seccomp = False  # CRIU's per-task fields of before per-thread seccomp
    for tid in tids:
        name = f"core-{tid}.img"
        core = _one(read(name, MAX_FILE_BYTES), at(name), "CORE", messages.core, messages)
        old_seccomp |= core.HasField("tc") and (core.tc.HasField("old_seccomp_mode")
                                                or core.tc.HasField("old_seccomp_filter"))
        images.arch = images.arch or core.mtype
        if tid == pid or not threads:
            state = core.tc.task_state if core.HasField("tc") else state
            comm = core.tc.comm if core.HasField("tc") else comm
            if core.HasField("ids"):
                namespaces.append(_namespaces(core.ids))
        threads.append(_thread(tid, core, filters, at(name)))
    if len(tids) > 1 and old_seccomp:
        raise ImageError(f"{at('pstree.img')}: process {pid} has several threads and per-task seccomp "
                         "fields in a thread's core, which CRIU applies to every thread: refused")
    threads = _propagate_tsync(pid, threads, filters, at("seccomp.img"))
    legacy = read(f"creds-{pid}.img", MAX_FILE_BYTES)
    if legacy is not None:
        entry = _one(legacy, at(f"creds-{pid}.img"), "CREDS", messages.creds, messages)
        # CRIU takes these for a task whose core holds none
        threads = [thread if thread.creds is not None else
                   ThreadImage(thread.tid, _creds(entry, at(f"creds-{pid}.img")), thread.seccomp_mode,
                               thread.seccomp_chain) for thread in threads]
    ids = _optional(read(f"ids-{pid}.img", MAX_FILE_BYTES), at(f"ids-{pid}.img"), "IDS",
                    messages.ids, messages)
    if ids is not None:
        namespaces.append(_namespaces(ids))
    if isinstance(comm, bytes):  # protobuf's Python decoder hands invalid UTF-8 back as bytes
        comm = comm.decode("utf-8", "replace")
    shown = "".join(char if char.isprintable() else "?" for char in comm[:64])  # it goes into one-line errors
    return TaskImage(pid, state, shown, tuple(threads), tuple(namespaces))


def _is_zombie(read: FileSource, pid: int, at: Callable[[str], str], messages: _Messages) -> bool:
    """Whether the task's own core says it is dead (TASK_DEAD); False when that core is missing (the caller then
    names the file it lacks)."""
    name = f"core-{pid}.img"
    data = read(name, MAX_FILE_BYTES)
    if data is None:
        return False
    core = _one(data, at(name), "CORE", messages.core, messages)
    return bool(core.HasField("tc") and core.tc.task_state == TASK_DEAD)


def read_cgroup_hierarchies(read: FileSource, where: str) -> list[str]:
    """The cgroup hierarchies CRIU mounts to put the restored processes back in their cgroups (cgroup.img's
    controllers, each as /proc/self/cgroup names it: 'cpu,cpuacct', 'name=systemd'; '' the unified one)."""
    messages = criu_messages()
    entry = _optional(read("cgroup.img", MAX_FILE_BYTES), f"{where}/cgroup.img", "CGROUP", messages.cgroup, messages)
    if entry is None:
        return []
    if len(entry.controllers) > MAX_CGROUP_CONTROLLERS:
        raise ImageError(f"{where}/cgroup.img: {len(entry.controllers)} cgroup controllers, more than "
                         f"{MAX_CGROUP_CONTROLLERS}")
    return [",".join(sorted(str(name) for name in controller.cnames)) for controller in entry.controllers]


def read_link_remaps(read: FileSource, where: str) -> list[LinkRemap]:
    """The link-remaps of a dump (remap-fpath.img's LINKED entries, the names from files.img, or
    reg-files.img of an older CRIU); [] when it made none. A remap name other than link_remap.N
    beside (or above) the removed name is refused: it is where CRIU's restore looks for it."""
    messages = criu_messages()
    data = read("remap-fpath.img", MAX_FILE_BYTES)
    if data is None:
        return []
    remaps = [entry for entry in _entries(data, f"{where}/remap-fpath.img", "REMAP_FPATH", messages.remap, messages,
                                          limit=MAX_REMAPS) if entry.remap_type == REMAP_TYPE_LINKED]
    if not remaps:
        return []
    names = _regular_file_names(read, where, messages)
    found = []
    for remap in remaps:
        removed, made = names.get(remap.orig_id), names.get(remap.remap_id)
        if removed is None or made is None:
            missing = remap.orig_id if removed is None else remap.remap_id
            raise ImageError(f"{where}/remap-fpath.img: link-remap of file id {missing}, which files.img does not hold")
        directory, _, base = made.rpartition("/")
        if (not made.startswith("/") or not LINK_REMAP_NAME.fullmatch(base) or not removed.startswith(directory + "/")
                or {".", ".."} & set(made.split("/"))):
            raise ImageError(f"{where}/files.img: link-remap name {made[:200]!r} for {removed[:200]!r} is not "
                             "CRIU's link_remap.N in a directory above it")
        found.append(LinkRemap(made, removed))
    return found


def _regular_file_names(read: FileSource, where: str, messages: _Messages) -> dict[int, str]:
    """File id -> name of every regular file entry (files.img; reg-files.img before CRIU 3.15 merged them)."""
    data = read("files.img", MAX_FILES_BYTES)
    if data is not None:
        entries = _entries(data, f"{where}/files.img", "FILES", messages.file, messages, limit=MAX_FILE_ENTRIES)
        regular = [entry.reg for entry in entries if entry.type == FD_TYPE_REG and entry.HasField("reg")]
    else:
        data = read("reg-files.img", MAX_FILES_BYTES)
        if data is None:
            raise ImageError(f"{where}/files.img: missing, and remap-fpath.img names link-remaps")
        regular = _entries(data, f"{where}/reg-files.img", "REG_FILES", messages.reg_file, messages,
                           limit=MAX_FILE_ENTRIES)
    names = {}
    for entry in regular:
        name = entry.name
        if isinstance(name, bytes) or "\0" in name:  # protobuf's Python decoder hands invalid UTF-8 back as bytes
            continue  # no name the container's processes could be matched by: never one link-remap names
        names[entry.id] = name
    return names


def _propagate_tsync(leader_tid: int, threads: list[ThreadImage], filters: list[Message],
                     where: str) -> list[ThreadImage]:
    """The seccomp each thread will hold, as CRIU restores it. When every thread shares the leader's
    filters, CRIU's dump keeps them on the leader only, flagged SECCOMP_FILTER_FLAG_TSYNC, and
    writes the other threads without seccomp (criu/seccomp.c try_use_tsync); the restorer installs
    the leader's filters with that flag, which puts them on every thread of the process. Those
    threads hold the leader's chain. Any other use of flags is not CRIU's and is refused: the
    restorer takes a failed TSYNC (it returns the conflicting thread's id) for success, leaving
    threads, the leader included, without filters."""
    flagged = {index for thread in threads for index in thread.seccomp_chain if filters[index].flags}
    if any(filters[index].flags & ~SECCOMP_FILTER_FLAG_TSYNC for index in flagged):
        raise ImageError(f"{where}: a seccomp filter of process {leader_tid} carries flags other than TSYNC, "
                         "which CRIU never writes: refused")
    leader = next((thread for thread in threads if thread.tid == leader_tid), None)
    others = [thread for thread in threads if thread is not leader]
    if not flagged or (leader is not None and not others):
        return threads  # TSYNC has no other thread to reach
    if (leader is None or set(leader.seccomp_chain) != flagged
            or any(thread.seccomp_mode != 0 for thread in others)):
        raise ImageError(f"{where}: process {leader_tid}'s seccomp filters are flagged TSYNC other than as CRIU "
                         "writes them (the leader's whole chain, the other threads without filters): refused")
    return [ThreadImage(thread.tid, thread.creds, 2, leader.seccomp_chain) if thread is not leader else thread
            for thread in threads]


def _thread(tid: int, core: Message, filters: list[Message], where: str) -> ThreadImage:
    if not core.HasField("thread_core"):
        return ThreadImage(tid, None, 0)
    thread_core = core.thread_core
    mode = thread_core.seccomp_mode if thread_core.HasField("seccomp_mode") else 0
    filter_index = thread_core.seccomp_filter if thread_core.HasField("seccomp_filter") else None
    if core.HasField("tc"):  # CRIU moves the old per-task fields into the thread's
        if core.tc.HasField("old_seccomp_mode"):
            mode = core.tc.old_seccomp_mode
        if core.tc.HasField("old_seccomp_filter"):
            filter_index = core.tc.old_seccomp_filter
    chain = _filter_chain(filter_index or 0, filters, where) if mode == 2 else ()
    creds = _creds(thread_core.creds, where) if thread_core.HasField("creds") else None
    return ThreadImage(tid, creds, mode, chain)


def _read_user_namespaces(read: FileSource, images: CheckpointImages, messages: _Messages,
                          at: Callable[[str], str]) -> None:
    ids = {spaces["user"] for task in images.tasks for spaces in task.namespaces}
    for user_ns in sorted(ids - {images.dumper_namespaces["user"]}):
        name = f"userns-{user_ns}.img"
        entry = _optional(read(name, MAX_FILE_BYTES), at(name), "USERNS", messages.userns, messages)
        if entry is None:
            continue
        maps: list[tuple[IdMap, ...]] = []
        for extents in (entry.uid_map, entry.gid_map):
            if len(extents) > MAX_MAP_EXTENTS:
                raise ImageError(f"{at(name)}: {len(extents)} map lines, more than the kernel's {MAX_MAP_EXTENTS}")
            maps.append(tuple(IdMap(extent.first, extent.lower_first, extent.count) for extent in extents))
        images.user_namespaces[user_ns] = (maps[0], maps[1])


def _read_mounts(read: FileSource, images: CheckpointImages, messages: _Messages, at: Callable[[str], str]) -> None:
    """The mounts of each mount namespace the tasks are in (CRIU restores those alone; one it was in itself is the
    restorer's, which the namespace check judges)."""
    ids = {spaces["mnt"] for task in images.tasks for spaces in task.namespaces if "mnt" in spaces}
    for mnt_ns in sorted(ids - {images.dumper_namespaces.get("mnt", -1)}):
        name = f"mountpoints-{mnt_ns}.img"
        data = read(name, MAX_FILE_BYTES)
        if data is None:
            continue  # CRIU restores no namespace without its mounts: it fails, naming the file
        entries = _entries(data, at(name), "MNTS", messages.mount, messages, limit=MAX_MOUNTS)
        images.mounts[mnt_ns] = tuple(
            MountImage(_text(entry.mountpoint), entry.fstype, _text(entry.root),
                       bool(entry.flags & MS_RDONLY),
                       bool(entry.HasField("ext_key") or (entry.HasField("ext_mount") and entry.ext_mount)),
                       _text(entry.fsname) if entry.HasField("fsname") else "",
                       bool(entry.HasField("with_plugin") and entry.with_plugin),
                       _text(entry.ext_key) if entry.HasField("ext_key") else
                       (_text(entry.mountpoint) if entry.HasField("ext_mount") and entry.ext_mount else ""))
            for entry in entries)


def _cgroup_names(read: FileSource, messages: _Messages, where: str) -> list[CgroupName]:
    """Every directory and file cgroup.img has CRIU make, move tasks into, chmod or write."""
    entry = _optional(read("cgroup.img", MAX_FILE_BYTES), where, "CGROUP", messages.cgroup, messages)
    if entry is None:
        return []
    names = [CgroupName(_text(control.name), _text(control.path), "") for cg_set in entry.sets
             for control in cg_set.ctls]
    for controller in entry.controllers:
        controllers = ",".join(sorted(_text(name) for name in controller.cnames))
        _cgroup_dirs(names, controllers, "", controller.dirs, depth=0, where=where)
    if len(names) > MAX_CGROUP_NAMES:
        raise ImageError(f"{where}: more than {MAX_CGROUP_NAMES} cgroup directories and files")
    return names


def _cgroup_dirs(names: list[CgroupName], controllers: str, parent: str, directories: Sequence[Message], *,
                 depth: int, where: str) -> None:
    """cgroup.img's directories below `parent`, their property files, and their children, into `names`."""
    if depth > MAX_CGROUP_DEPTH:
        raise ImageError(f"{where}: cgroup directories nested deeper than {MAX_CGROUP_DEPTH}")
    for directory in directories:
        if len(names) > MAX_CGROUP_NAMES:
            raise ImageError(f"{where}: more than {MAX_CGROUP_NAMES} cgroup directories and files")
        path = f"{parent}/{_text(directory.dir_name)}"
        names.append(CgroupName(controllers, path, ""))
        names += [CgroupName(controllers, path, _text(prop.name)) for prop in directory.properties]
        _cgroup_dirs(names, controllers, path, directory.children, depth=depth + 1, where=where)


def _text(value: str | bytes) -> str:
    """A string field as text: protobuf's Python decoder hands invalid UTF-8 back as bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
