"""What a checkpoint's processes ask for, against what the container's spec grants: refused if more.

CRIU restores every thread's credentials, seccomp state and namespaces from the image, as root,
whatever the engine's spec says; an edited image (or archive) could so restore a process with
every capability into a container whose spec gives it the defaults. Phases: parse the spec's
grant (process.user, process.capabilities, noNewPrivileges, linux.seccomp, linux.namespaces,
uid/gid mappings), read the images (oci.criu_images), and compare, live task by live task
(a zombie never runs), thread by thread.

What "more than the spec grants" means, field by field, is what a process started from that spec
could reach under the kernel's rules (a process may always drop privilege):
- bounding set: only ever shrinks, so it must be within the spec's bounding set;
- permitted and effective sets: within the spec's permitted set when the spec sets
  noNewPrivileges; without it, an execve of a setuid-root or file-capability program (the
  container's rootfs may hold one) raises them to the bounding set, so within bounding+permitted;
- ambient: within the reachable permitted set (or the spec's ambient); inheritable: within the
  spec's inheritable set, the reachable permitted set, or the bounding set with CAP_SETPCAP;
- uids (real, effective, saved, filesystem), gids and supplementary groups: with
  noNewPrivileges and without CAP_SETUID (resp. CAP_SETGID) reachable, only the spec's user,
  group and additionalGids; otherwise a setuid program or the capability reaches any of them;
- securebits: only set with CAP_SETPCAP, so none without it reachable;
- no_new_privs: once set never cleared, so every thread has it when the spec sets it;
- seccomp: when the spec has linux.seccomp, every thread runs under a filter (or strict mode),
  and its chain of filters, run as the kernel runs them (policy.seccomp_bpf), must deny each syscall
  of GUARDED_SYSCALLS (modules, file handles, mounts, BPF, keys, ptrace, the clock...) that the
  spec denies whatever its arguments (x86_64 images). Other syscalls are not compared: that
  would need libseccomp's compilation of the spec;
- namespaces: for each namespace the spec creates, no process may be in the namespace CRIU
  itself was in when it dumped (inventory.img's root_ids): CRIU would then restore it into the
  restoring node's namespace instead of a new one. Without a user namespace in the spec, no
  process may have one (CRIU writes its id maps from the image, as root); with one, the image's
  maps must lie within the spec's.
A spec without process.capabilities leaves runc's capabilities as they are: no capability limit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ImageError
from ..host.safefiles import read_bounded
from ..oci import tarstream
from ..oci.criu_images import (
    CheckpointImages,
    Creds,
    IdMap,
    TaskImage,
    ThreadImage,
    directory_source,
    image_limit,
    mapping_source,
    read_checkpoint_images,
    wanted_image,
)
from ..oci.spec import Capabilities, Mount, Spec, load_exact_json
from .image_mounts import cgroup_problems, mount_problems
from .seccomp_bpf import AUDIT_ARCH_X86_64, allowed_syscalls, decode

# Linux capability numbers (include/uapi/linux/capability.h)
CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
                "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
                "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
                "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
                "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
                "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE")
CAP_NUMBERS = {f"CAP_{name}": number for number, name in enumerate(CAPABILITIES)}
CAP_SETGID, CAP_SETUID, CAP_SETPCAP = CAP_NUMBERS["CAP_SETGID"], CAP_NUMBERS["CAP_SETUID"], CAP_NUMBERS["CAP_SETPCAP"]
CAP_SYS_ADMIN = CAP_NUMBERS["CAP_SYS_ADMIN"]
# OCI namespace types -> CRIU's namespace ids; the kinds CRIU decides to create from the ids
# (criu/pstree.c get_clone_mask). cgroup namespaces are restored from the cgroup image instead.
NAMESPACE_KINDS = {"pid": "pid", "network": "net", "ipc": "ipc", "uts": "uts", "mount": "mnt", "user": "user",
                   "time": "time"}
SECCOMP_DISABLED, SECCOMP_FILTER = 0, 2
X86_64 = 1  # core_entry.mtype
# Syscalls that widen what a process reaches (kernel modules, file handles, mounts, BPF, keys,
# other processes, the clock), x86_64 numbers (asm/unistd_64.h): where the spec's seccomp denies
# one, the image's filters must deny it too.
GUARDED_SYSCALLS = {
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "mount": 165, "umount2": 166, "pivot_root": 155,
    "swapon": 167, "swapoff": 168, "reboot": 169, "bpf": 321, "perf_event_open": 298, "ptrace": 101,
    "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248, "request_key": 249, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "move_mount": 429, "open_tree": 428, "userfaultfd": 323, "iopl": 172,
    "ioperm": 173, "clock_settime": 227, "settimeofday": 164, "clock_adjtime": 305, "adjtimex": 159, "acct": 163,
    "quotactl": 179, "lookup_dcookie": 212, "process_vm_writev": 311, "process_vm_readv": 310, "syslog": 103,
    "sethostname": 170, "setdomainname": 171, "chroot": 161, "mknod": 133, "create_module": 174,
    "query_module": 178, "nfsservctl": 180, "uselib": 134, "vhangup": 153, "_sysctl": 156,
}
# The same syscalls through a 64-bit process's other entries, which its filters see apart: int 0x80
# (IA32 emulation: i386 numbers, asm/unistd_32.h, seccomp_data.arch AUDIT_ARCH_I386) and, where the
# kernel has x32, nr | 0x40000000 under AUDIT_ARCH_X86_64 (x32's own number where it has one).
AUDIT_ARCH_I386, X32_SYSCALL_BIT = 0x40000003, 0x40000000
I386_SYSCALLS = {
    "kexec_load": 283, "init_module": 128, "finit_module": 350, "delete_module": 129, "open_by_handle_at": 342,
    "name_to_handle_at": 341, "mount": 21, "umount2": 52, "pivot_root": 217, "swapon": 87, "swapoff": 115,
    "reboot": 88, "bpf": 357, "perf_event_open": 336, "ptrace": 26, "unshare": 310, "setns": 346, "keyctl": 288,
    "add_key": 286, "request_key": 287, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "move_mount": 429,
    "open_tree": 428, "userfaultfd": 374, "iopl": 110, "ioperm": 101, "clock_settime": 264, "settimeofday": 79,
    "clock_adjtime": 343, "adjtimex": 124, "acct": 51, "quotactl": 131, "lookup_dcookie": 253,
    "process_vm_writev": 348, "process_vm_readv": 347, "syslog": 103, "sethostname": 74, "setdomainname": 121,
    "chroot": 61, "mknod": 14, "create_module": 127, "query_module": 167, "nfsservctl": 169, "uselib": 86,
    "vhangup": 111, "_sysctl": 149,
}
X32_OWN_SYSCALLS = {"ptrace": 521, "kexec_load": 528, "process_vm_readv": 539, "process_vm_writev": 540}
NOT_X32 = {"_sysctl", "create_module", "nfsservctl", "query_module", "uselib"}  # asm/unistd_x32.h has none
MAX_CHAIN_INSNS = 32768  # the kernel's MAX_INSNS_PER_PATH (4 more per filter): it installs no longer chain
NOT_DENYING = {"SCMP_ACT_ALLOW", "SCMP_ACT_LOG", "SCMP_ACT_TRACE", "SCMP_ACT_NOTIFY"}
MAX_SHOWN = 4


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class SpecUser(_Part):
    uid: int = 0
    gid: int = 0
    additionalGids: list[int] = []


class SpecProcess(_Part):
    user: SpecUser = SpecUser()
    capabilities: Capabilities | None = None
    noNewPrivileges: bool = False


class SpecNamespace(_Part):
    type: str
    path: str = ""


class SpecIdMapping(_Part):
    containerID: int
    hostID: int
    size: int


class SpecLinux(_Part):
    namespaces: list[SpecNamespace] = []
    uidMappings: list[SpecIdMapping] = []
    gidMappings: list[SpecIdMapping] = []
    seccomp: dict[str, Any] | None = None  # JSON as the spec has it: _denied_by reads what it knows
    maskedPaths: list[str] = []
    readonlyPaths: list[str] = []


class SpecGrant(_Part):
    """The parts of an OCI spec that bound what the container's processes may hold."""

    process: SpecProcess = SpecProcess()
    mounts: list[Mount] = []
    linux: SpecLinux = SpecLinux()


def parse_grant(spec_bytes: bytes, where: str) -> SpecGrant:
    try:
        return SpecGrant.model_validate(load_exact_json(spec_bytes, where, (SpecGrant, Spec)))
    except (ValueError, ValidationError, RecursionError) as error:
        raise ImageError(f"{where}: not a valid OCI spec: {str(error).splitlines()[0]}") from None


def _numbers(names: list[str]) -> frozenset[int]:
    return frozenset(CAP_NUMBERS[name] for name in names if name in CAP_NUMBERS)


def _names(numbers: Iterable[int]) -> str:
    names = [f"CAP_{CAPABILITIES[n]}" if n < len(CAPABILITIES) else f"capability {n}" for n in sorted(numbers)]
    shown = ", ".join(names[:MAX_SHOWN])
    return f"{shown} (+{len(names) - MAX_SHOWN} more)" if len(names) > MAX_SHOWN else shown or "none"


class Grant:
    """The ceilings a spec sets, computed once."""

    def __init__(self, spec: SpecGrant) -> None:
        self.spec = spec
        process = spec.process
        self.no_new_privs = process.noNewPrivileges
        caps = process.capabilities
        self.limits_caps = caps is not None
        if caps is not None:
            self.bounding = _numbers(caps.bounding)
            permitted = _numbers(caps.permitted)
            self.reachable = permitted if self.no_new_privs else permitted | self.bounding
            self.ambient = self.reachable | _numbers(caps.ambient)
            setpcap = CAP_SETPCAP in self.reachable
            self.inheritable = _numbers(caps.inheritable) | self.reachable | (self.bounding if setpcap else frozenset())
        self.uids_free = not self.no_new_privs or self._reachable(CAP_SETUID)
        self.gids_free = not self.no_new_privs or self._reachable(CAP_SETGID)
        self.secbits_free = self._reachable(CAP_SETPCAP)
        self.new_namespaces = {ns.type for ns in spec.linux.namespaces if not ns.path}
        self.denied_syscalls = _denied_by(spec.linux.seccomp) if spec.linux.seccomp is not None else {}
        # CAP_SYS_ADMIN in the host's user namespace: the container could make any mount itself
        self.mounts_itself = self._reachable(CAP_SYS_ADMIN) and "user" not in self.new_namespaces

    def _reachable(self, cap: int) -> bool:
        return not self.limits_caps or cap in self.reachable


def refusals(images: CheckpointImages, spec: SpecGrant, *, floor: bool = False) -> list[str]:
    """One line per thing a live process of the images holds beyond the spec's grant, or a mount or cgroup they
    make beyond it (`floor`: the spec came with the images, unsigned: held to every runtime's default masking)."""
    grant, problems = Grant(spec), []
    filters = _Filters(images)
    for task in images.tasks:
        if not task.alive:
            continue
        problems += _namespace_problems(task, images, grant)
        for thread in task.threads:
            who = f"process {task.pid} ({task.comm})" + (f" thread {thread.tid}" if thread.tid != task.pid else "")
            problems += [f"{who}: {problem}" for problem in _thread_problems(thread, grant, filters)]
    problems += mount_problems(images, spec.mounts, spec.linux.maskedPaths, spec.linux.readonlyPaths,
                               mounts_itself=grant.mounts_itself, floor=floor)
    problems += cgroup_problems(images.cgroup_names)
    return list(dict.fromkeys(problems))


def check_images(images: CheckpointImages, spec: SpecGrant, what: str, *, floor: bool = False) -> None:
    """ImageError, one line, if the images ask for more than the spec grants."""
    found = refusals(images, spec, floor=floor)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ImageError(f"{what}: the checkpoint holds more than the container's spec grants: {found[0]}{more}: "
                         "refused")


def _thread_problems(thread: ThreadImage, grant: Grant, filters: _Filters) -> list[str]:
    creds = thread.creds
    if creds is None:
        return ["no credentials in its core image (CRIU would leave it the restorer's, root's): "
                "the spec grants only its own"]
    return [*_capability_problems(creds, grant), *_identity_problems(creds, grant),
            *_privilege_problems(thread, creds, grant, filters)]


def _capability_problems(creds: Creds, grant: Grant) -> list[str]:
    problems: list[str] = []
    if grant.limits_caps:
        for label, held, allowed, allowed_as in (
                ("effective", creds.cap_eff, grant.reachable, _reach_words(grant)),
                ("permitted", creds.cap_prm, grant.reachable, _reach_words(grant)),
                ("bounding", creds.cap_bnd, grant.bounding, "the spec's bounding set"),
                ("ambient", creds.cap_amb, grant.ambient, _reach_words(grant) + " or ambient set"),
                ("inheritable", creds.cap_inh, grant.inheritable, "the spec's inheritable, permitted or bounding "
                                                                  "sets")):
            if extra := held - allowed:
                problems.append(f"{label} capabilities hold {_names(extra)}; the spec allows at most "
                                f"{_names(allowed)} ({allowed_as})")
    return problems


def _identity_problems(creds: Creds, grant: Grant) -> list[str]:
    """The uids and gids (and groups) it holds beyond the spec's user, where it could not take them itself."""
    problems = []
    user = grant.spec.process.user
    if not grant.uids_free:
        uids = {creds.uid, creds.euid, creds.suid, creds.fsuid} - {user.uid}
        if uids:
            problems.append(f"uid {', '.join(map(str, sorted(uids)))}, the spec runs it as uid {user.uid} with "
                            "noNewPrivileges and without CAP_SETUID")
    if not grant.gids_free:
        gids = {creds.gid, creds.egid, creds.sgid, creds.fsgid} - {user.gid}
        groups = set(creds.groups) - {user.gid, *user.additionalGids}
        if gids or groups:
            problems.append(f"gid/groups {', '.join(map(str, sorted(gids | groups)))}, the spec gives gid {user.gid} "
                            f"and groups {user.additionalGids} with noNewPrivileges and without CAP_SETGID")
    return problems


def _privilege_problems(thread: ThreadImage, creds: Creds, grant: Grant, filters: _Filters) -> list[str]:
    """Securebits, no_new_privs and seccomp: what the spec sets that the thread does without."""
    problems = []
    if creds.secbits and not grant.secbits_free:
        problems.append(f"securebits {creds.secbits:#x}, the spec gives none and no CAP_SETPCAP to set them")
    if grant.no_new_privs and not creds.no_new_privs:
        problems.append("no_new_privs off, the spec sets noNewPrivileges")
    if grant.spec.linux.seccomp is not None and thread.seccomp_mode == SECCOMP_DISABLED:
        problems.append("no seccomp filter, the spec gives the container one (linux.seccomp)")
    elif (thread.seccomp_mode == SECCOMP_FILTER and grant.denied_syscalls and filters.checkable
            and (permitted := filters.allowed(thread.seccomp_chain, grant.denied_syscalls))):
        problems.append(f"its seccomp filters allow {', '.join(permitted[:MAX_SHOWN])}"
                        f"{f' (+{len(permitted) - MAX_SHOWN} more)' if len(permitted) > MAX_SHOWN else ''}, "
                        "which the spec's linux.seccomp denies")
    return problems


def _denied_by(seccomp: dict[str, Any]) -> dict[str, int]:
    """The guarded syscalls the spec's seccomp denies whatever their arguments (x86_64)."""
    rules = seccomp.get("syscalls") or []
    arches = seccomp.get("architectures") or []
    if not isinstance(rules, list) or (arches and "SCMP_ARCH_X86_64" not in arches):
        return {}
    allowing, denying = set(), set()
    for rule in rules:
        if not isinstance(rule, dict) or not isinstance(rule.get("names"), list):
            continue
        names = {name for name in rule["names"] if isinstance(name, str)}
        if rule.get("action") in NOT_DENYING:
            allowing |= names  # with or without argument conditions: not denied whatever the arguments
        elif not rule.get("args"):
            denying |= names
    denied = set(GUARDED_SYSCALLS) if seccomp.get("defaultAction") not in NOT_DENYING else denying
    return {name: GUARDED_SYSCALLS[name] for name in sorted(denied - allowing) if name in GUARDED_SYSCALLS}


class _Filters:
    """The images' seccomp programs, decoded once; what a thread's chain allows."""

    def __init__(self, images: CheckpointImages) -> None:
        self.checkable = images.arch == X86_64  # the guarded syscalls' numbers are x86_64's
        self.where = f"{images.where}/seccomp.img"
        self.programs = [decode(program, f"{self.where} filter {index}")
                         for index, program in enumerate(images.seccomp_programs)] if self.checkable else []
        self.passing: dict[tuple[int, int, int], bool] = {}  # (program, arch, nr): some path allows it

    def allowed(self, chain: tuple[int, ...], syscalls: dict[str, int]) -> list[str]:
        if sum(len(self.programs[index]) + 4 for index in chain) > MAX_CHAIN_INSNS:
            raise ImageError(f"{self.where}: a chain of seccomp filters longer than the kernel installs "
                             f"({MAX_CHAIN_INSNS} instructions)")
        entries = {name: _entries(name, number) for name, number in syscalls.items()}
        wanted = {entry for found in entries.values() for entry in found}
        for index in dict.fromkeys(chain):
            for arch in {arch for arch, _ in wanted}:
                if unknown := {nr for entry_arch, nr in wanted
                               if entry_arch == arch and (index, arch, nr) not in self.passing}:
                    passed = allowed_syscalls([self.programs[index]], unknown, self.where, arch)  # once per program
                    self.passing.update({(index, arch, nr): nr in passed for nr in unknown})
        return [name for name, found in entries.items()
                if any(all(self.passing[(index, arch, nr)] for index in chain) for arch, nr in found)]


def _entries(name: str, number: int) -> list[tuple[int, int]]:
    """Each (seccomp_data.arch, nr) by which a 64-bit process makes syscall `name`."""
    found = [(AUDIT_ARCH_X86_64, number)]
    if name not in NOT_X32:
        found.append((AUDIT_ARCH_X86_64, X32_OWN_SYSCALLS.get(name, number) | X32_SYSCALL_BIT))
    if name in I386_SYSCALLS:
        found.append((AUDIT_ARCH_I386, I386_SYSCALLS[name]))
    return found


def _reach_words(grant: Grant) -> str:
    return "the spec's permitted set" if grant.no_new_privs else "the spec's permitted and bounding sets"


def _namespace_problems(task: TaskImage, images: CheckpointImages, grant: Grant) -> list[str]:
    problems, dumper = [], images.dumper_namespaces
    who = f"process {task.pid} ({task.comm})"
    for namespaces in task.namespaces:
        for oci_type, kind in NAMESPACE_KINDS.items():
            if oci_type in grant.new_namespaces and namespaces[kind] == dumper[kind]:
                problems.append(f"{who}: its {oci_type} namespace is the one CRIU dumped from (the node's), "
                                f"the spec gives the container a new one")
        user_ns = namespaces["user"]
        if user_ns != dumper["user"] and "user" not in grant.new_namespaces:
            problems.append(f"{who}: a user namespace of its own (id maps from the image), the spec gives none")
        elif user_ns in images.user_namespaces:
            uid_map, gid_map = images.user_namespaces[user_ns]
            for label, extents, allowed in (("uid", uid_map, grant.spec.linux.uidMappings),
                                            ("gid", gid_map, grant.spec.linux.gidMappings)):
                for extent in extents:
                    if not _within(extent, allowed):
                        problems.append(f"{who}: its user namespace maps {label}s {extent.first}-"
                                        f"{extent.first + extent.count - 1} to host {extent.lower_first}-"
                                        f"{extent.lower_first + extent.count - 1}, beyond the spec's {label}Mappings")
    return problems


def _within(extent: IdMap, allowed: list[SpecIdMapping]) -> bool:
    return any(mapping.containerID <= extent.first
               and extent.first + extent.count <= mapping.containerID + mapping.size
               and extent.lower_first - extent.first == mapping.hostID - mapping.containerID
               for mapping in allowed)


# --- where the images and the spec come from ----------------------------------------------------

MAX_SPEC_BYTES = 16 << 20
MAX_KEPT_BYTES = 256 << 20  # every credential-bearing image of an archive together
CHECKPOINT_PREFIX = "checkpoint/"


def check_restore(image_dir: str, bundle: str, what: str, *, unsigned: bool = False) -> None:
    """The shim's restore: CRIU's images in `image_dir` against the bundle's config.json (`unsigned`: a dump no
    signature vouches for, whose spec may have come with it)."""
    if not os.path.lexists(os.path.join(image_dir, "inventory.img")):
        return  # CRIU restores nothing without it (it is the first file CRIU reads): the delegate says why
    spec_path = f"{bundle.rstrip('/')}/config.json"
    spec = parse_grant(read_bounded(spec_path, MAX_SPEC_BYTES, spec_path), spec_path)
    check_images(read_checkpoint_images(directory_source(image_dir), image_dir), spec, what, floor=unsigned)


def check_archive(tar_path: str, spec_bytes: bytes, what: str) -> None:
    """`gpuckpt import`: the checkpoint/ images of a checked tar (written by us, uncompressed)
    against the archive's spec.dump, before podman sees it."""
    spec = parse_grant(spec_bytes, f"{what}: spec.dump")
    files: dict[str, bytes] = {}
    kept = 0
    with open(tar_path, "rb") as source:
        for member, reader in tarstream.entries(source, what):
            name = member.name[len(CHECKPOINT_PREFIX):] if member.name.startswith(CHECKPOINT_PREFIX) else ""
            if not member.isfile() or not wanted_image(name):
                tarstream.copy_data(reader, member.size if member.isfile() else 0, None)
                continue
            if member.size > image_limit(name):
                raise ImageError(f"{what}: {member.name} declares {member.size} bytes, more than the "
                                 f"{image_limit(name)} a CRIU image of it may hold")
            kept += member.size
            if kept > MAX_KEPT_BYTES:
                raise ImageError(f"{what}: its CRIU process images exceed {MAX_KEPT_BYTES} bytes together")
            data = bytearray()
            tarstream.copy_data(reader, member.size, _Sink(data), pad=False)
            files[name] = bytes(data)
    check_images(read_checkpoint_images(mapping_source(files), f"{what}:checkpoint"), spec, what)


class _Sink:
    """Keeps what copy_data writes."""

    def __init__(self, data: bytearray) -> None:
        self.data = data

    def write(self, chunk: tarstream.Data) -> None:
        self.data += chunk
