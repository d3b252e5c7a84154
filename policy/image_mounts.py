"""What a checkpoint's mount and cgroup images make CRIU do as root, against the container's spec.

CRIU rebuilds each restored mount namespace from mountpoints-<id>.img and the container's cgroups
from cgroup.img, as root, whatever the engine's spec says. An edited image (an unsigned archive
the trust policy lets in, or one from elsewhere) could so mount /proc/sys read-write (its
kernel.core_pattern runs a program on the host), binfmt_misc (a handler the host runs as root),
the host's disk by name, debugfs or tracefs, or name a cgroup file "../../etc/..." that CRIU
chmods and writes outside its cgroup yard. The rules, mount by mount:
- no mountpoint or root with a ".." component (CRIU joins them to its own paths);
- a mount whose source the runtime's map names (external: bind mounts, runc's cgroup and
  /dev/null binds) keeps its flags only: read-only where the spec says so; it sits where its key
  says (runc keys each by its mountpoint; the /dev/null over masked files and crun's empty directory over
  masked directories by their own paths), once;
- otherwise only what an OCI runtime mounts from a spec: whole tmpfs, devpts, mqueue anywhere;
  proc, sysfs and cgroup where the spec mounts them (read-only where the spec says so), a bind of
  part of proc or sysfs only read-only at the read-only path it shows (/proc/sys: proc's /sys);
  at "/" anything (CRIU binds the runtime's root there);
  nothing by name, nothing a plugin restores;
- each of the spec's readonlyPaths and maskedPaths under /proc or /sys that this node's kernel
  has is covered: read-only, or masked by something other than proc or sysfs.
A spec that lets the container mount things itself (CAP_SYS_ADMIN reachable, no user namespace)
is not held to the type rules: such a container could make those mounts after the restore; the
read-only and masking rules still hold (an unsigned dump's spec is the dump's own: not there).
cgroup.img's names are judged always: a directory or file is a plain name below the yard.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable

from ..oci.criu_images import CgroupName, CheckpointImages, MountImage
from ..oci.spec import Mount

FSTYPES = {0: "unsupported", 1: "proc", 2: "sysfs", 3: "devtmpfs", 4: "binfmt_misc", 5: "tmpfs", 6: "devpts",
           7: "simfs", 8: "pstore", 9: "securityfs", 10: "fusectl", 11: "debugfs", 12: "cgroup", 13: "aufs",
           14: "mqueue", 15: "fuse", 16: "auto", 17: "overlay", 18: "autofs", 19: "tracefs", 23: "cgroup2"}
PROC, SYSFS, TMPFS, DEVPTS, CGROUP, MQUEUE, CGROUP2 = 1, 2, 5, 6, 12, 14, 23
ANYWHERE = {TMPFS, DEVPTS, MQUEUE}
# What every runtime's default spec hides or makes read-only (runc's `runc spec`, podman's containers.conf; the
# paths both list): the floor an unsigned dump's spec cannot lower, since that spec comes with the dump
FLOOR_READ_ONLY = frozenset({"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger", "/sys"})
FLOOR_MASKED = frozenset({"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                          "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"})
# the spec's mount types each kernel filesystem is allowed under
SPEC_TYPES = {PROC: ("proc",), SYSFS: ("sysfs",), CGROUP: ("cgroup", "cgroup2"), CGROUP2: ("cgroup", "cgroup2")}
PROPERTY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,254}")
MAX_SHOWN = 3
# the runtimes' keys for what they bind over masked paths: runc's (and crun's) /dev/null over files, crun's empty
# directory over directories (crun 1.28: /sys/firmware, /proc/acpi, /proc/scsi)
MASK_KEYS = frozenset({"/dev/null", "/run/crun/.empty-directory"})
CGROUP_ROOT = "/sys/fs/cgroup"


def _norm(path: str) -> str:
    return posixpath.normpath("/" + path.lstrip("/"))  # normpath keeps a leading "//"


def _climbs(path: str) -> bool:
    return ".." in path.split("/") or "\0" in path


def mount_problems(images: CheckpointImages, mounts: Iterable[Mount], masked: Iterable[str],
                   read_only_paths: Iterable[str], *, mounts_itself: bool, floor: bool = False,
                   exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    """One phrase per mount the images make beyond what `mounts` (the spec's), its masked and read-only paths allow.
    `mounts_itself`: the spec lets the container mount things itself (the type rules are moot). `floor`: the spec
    is as untrusted as the images (an unsigned dump's): every runtime's default masked and read-only paths, and
    cgroup hierarchies read-only, whatever it says, and its capabilities excuse no mount."""
    mounts = list(mounts)
    mounts_itself = mounts_itself and not floor
    marked = {_norm(path) for path in read_only_paths} | (FLOOR_READ_ONLY if floor else set())
    masked = {_norm(path) for path in masked} | (FLOOR_MASKED if floor else set())
    read_only = marked | {_norm(m.destination) for m in mounts if "ro" in m.options}
    problems: list[str] = []
    for namespace, found in sorted(images.mounts.items()):
        where = f"mount namespace {namespace}"
        at = {_norm(mount.mountpoint): mount for mount in found}
        problems += [f"{where}: {problem}" for mount in found
                     if (problem := _mount_problem(mount, mounts, read_only, mounts_itself=mounts_itself,
                                                   floor=floor))]
        keys = [mount.ext_key for mount in found if mount.external and mount.ext_key not in MASK_KEYS]
        problems += [f"{where}: the runtime's source for {key[:200]!r} mounted twice"
                     for key in sorted({key for key in keys if keys.count(key) > 1})]
        for path in sorted(marked):
            if _kernel_path(path) and exists(path) and not (path in at and at[path].read_only):
                problems.append(f"{where}: {path} is not read-only, which the spec makes it")
        for path in sorted(masked):
            if _kernel_path(path) and exists(path) and (path not in at or at[path].fstype in (PROC, SYSFS)):
                problems.append(f"{where}: {path} is not masked, which the spec masks")
        # a runtime's mask only where the spec masks: crun's empty directory is one host directory behind every
        # crun container's masks, which a mount of it elsewhere would let this one write (attack30j). Every mount,
        # not one per mountpoint: a key stacked on the spec's /etc/hosts and listed first passed (attack30k)
        problems += [f"{where}: {point}: the runtime's mask {key!r} where the spec masks nothing"
                     for point, key in sorted({(_norm(m.mountpoint), m.ext_key) for m in found
                                               if m.external and m.ext_key in MASK_KEYS}) if point not in masked]
        # a mount below a masked path shows what the mask hides (attack30h: sysfs below /sys/firmware)
        problems += [f"{where}: {point} is mounted below {path}, which the spec masks" for point in sorted(at)
                     for path in sorted(masked) if point.startswith(path + "/")]
    return problems


def _kernel_path(path: str) -> bool:
    return path.startswith(("/proc/", "/sys/"))


def _mount_problem(mount: MountImage, mounts: list[Mount], read_only: set[str], *, mounts_itself: bool,
                   floor: bool) -> str:
    point = _norm(mount.mountpoint)
    kind = FSTYPES.get(mount.fstype, f"fstype {mount.fstype}")
    if _climbs(mount.mountpoint) or _climbs(mount.root):
        return f"a mount at {mount.mountpoint[:200]!r} (root {mount.root[:200]!r}) climbs out with '..'"
    # an external mount under /sys/fs/cgroup is the runtime's cgroup hierarchy whatever fstype the image gives it
    # (attack30h: conmon's pids hierarchy at its own key, read-write, "a tmpfs")
    cgroup = mount.fstype in (CGROUP, CGROUP2) or (mount.external and point.startswith(CGROUP_ROOT + "/"))
    cgroup_read_only = cgroup and (floor or any(
        "ro" in m.options for m in mounts if m.type.startswith("cgroup") and _covers(m, point)))
    # runc leaves the tmpfs under a read-only cgroup mount read-write: a tmpfs of its own is no host's
    own_tmpfs = mount.fstype == TMPFS and not mount.external
    if (point in read_only and not own_tmpfs or cgroup_read_only) and not mount.read_only:
        return f"{point} ({kind}) is mounted read-write, which the spec makes read-only"
    if mount.external and mount.ext_key not in MASK_KEYS and _norm(mount.ext_key) != point:
        # CRIU binds the runtime's source for that key here, whatever the image says the mount is (attack30g: the
        # pids hierarchy of every container's conmon at /mnt, read-write, said to be a tmpfs)
        return f"{point}: an external mount keyed {mount.ext_key[:200]!r}, the runtime's source for another path"
    return _made_problem(mount, point, kind, mounts, mounts_itself=mounts_itself)


def _made_problem(mount: MountImage, point: str, kind: str, mounts: list[Mount], *, mounts_itself: bool) -> str:
    """What is wrong with a mount CRIU makes from the image itself (not the runtime's map), or ""."""
    if mount.external or mounts_itself:
        return ""  # the runtime's map gives its source; or the container could mount it itself
    if mount.with_plugin or mount.fsname:
        return f"{point}: a {mount.fsname[:40] or kind} mount CRIU makes by name or through a plugin"
    if point == "/":
        return ""  # the root: CRIU binds the runtime's root there, whatever the image says it was
    if mount.fstype in ANYWHERE:
        # a root below "/" is CRIU's bind of another mount's path, followed in CRIU's own (the host's) root while
        # it builds the tree: a link in /dev's tmpfs image to "/" made one the host's /etc (attack30g)
        if mount.root == "/" or (mount.fstype == DEVPTS and point == "/dev/console" and
                                 mount.root.lstrip("/").isdigit()):
            return ""  # (a terminal's console: the runtime binds the container's pty at /dev/console)
        return f"{point}: a bind of {kind}'s {mount.root[:200]!r} (only whole ones)"
    if mount.fstype in SPEC_TYPES:
        if mount.root != "/":
            return _part_problem(mount, point, kind)
        if any(_covers(m, point) for m in mounts if m.type in SPEC_TYPES[mount.fstype]):
            return ""
        return f"{point}: a {kind} mount where the spec mounts none"
    return f"{point}: a {kind} mount, which no runtime makes from a spec"


def _part_problem(mount: MountImage, point: str, kind: str) -> str:
    """A bind of part of proc or sysfs: only read-only, at the path it shows (/proc/sys: proc's /sys), never
    through a process's directory: proc's /1/root is CRIU's root task's root, the host's, while it mounts
    (attack30g)."""
    home = {PROC: "/proc", SYSFS: "/sys"}.get(mount.fstype)
    first = _norm(mount.root).split("/")[1]
    if home is None or point != home + _norm(mount.root) or not mount.read_only or first.isdigit() or \
            first in ("self", "thread-self"):
        return f"{point}: a bind of {kind}'s {mount.root[:200]!r}, not read-only at the path it shows"
    return ""


def _covers(mount: Mount, point: str) -> bool:
    """The spec's mount at `point` (a cgroup v1 hierarchy: below the spec's cgroup mount)."""
    destination = _norm(mount.destination)
    return point == destination or (mount.type.startswith("cgroup") and point.startswith(destination + "/"))


def cgroup_problems(names: Iterable[CgroupName]) -> list[str]:
    """One phrase per cgroup directory or file CRIU would make outside its yard or by an odd name. Their modes are
    not judged: CRIU dumps freezer.state's from memory it never set (attack30e: random set-id bits in real dumps),
    and a mode inside the yard reaches nothing outside it."""
    problems = []
    for found in names:
        shown = f"{found.controllers[:40] or 'cgroup2'}:{found.path[:120]}" + (f"/{found.name[:80]}" if found.name
                                                                               else "")
        if _climbs(found.path) or _climbs(found.controllers):
            problems.append(f"cgroup {shown!r} climbs out of CRIU's cgroup yard with '..'")
        elif found.name and not PROPERTY.fullmatch(found.name):
            problems.append(f"cgroup file {shown!r} is not a plain file name")
    return problems[:MAX_SHOWN * 4]
