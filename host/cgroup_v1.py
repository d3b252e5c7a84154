"""cgroup v1 hierarchies that exist but are not mounted where crun enters them (/sys/fs/cgroup/NAME).

Such a hierarchy stays behind when something mounted a controller (or a named
hierarchy) elsewhere, made cgroups in it and unmounted it: a container's own
systemd, CRIU's cgroup yard restoring an image that listed it, a `perf` user.
Every process still has a line for it in /proc/self/cgroup, in the root.

crun's restore (1.8 to at least 1.28, libcrun restore_proxy_process) reads its
proxy process's own cgroup from the first line of /proc/self/cgroup that is not
`memory`, moves the proxy to that cgroup's parent and destroys the cgroup. The
newest hierarchy comes first; when crun could not place the proxy in it, the
path is "/" and crun kills every process in the root cgroup: the whole node
(seen on this project's test machines: dockerd, the CI run, every shell).
"""

from __future__ import annotations

import os

CGROUP_ROOT = "/sys/fs/cgroup"
# Mount options of a cgroup v1 super block that are not controllers.
_NOT_CONTROLLERS = {"rw", "ro", "none", "noprefix", "xattr", "clone_children", "cpuset_v2_mode", "favordynmods"}


def hybrid_or_legacy(cgroup_root: str = CGROUP_ROOT) -> bool:
    """True where /sys/fs/cgroup is not itself the cgroup v2 hierarchy (crun's CGROUP_MODE_UNIFIED)."""
    return not os.path.exists(os.path.join(cgroup_root, "cgroup.controllers"))


def _cgroup_mounts(mountinfo: str) -> dict[str, frozenset[str]]:
    """The controller sets ('cpu', 'name=systemd', ...) of the v1 hierarchies crun can enter, by mount
    point: a later mount at or above a point hides what was there (a tmpfs over it: crun's mkdir and
    write land in the tmpfs), and crun skips a read-only one (EROFS), its proxy left in the root."""
    mounted: dict[str, frozenset[str]] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 6:
            continue
        point, after = fields[4], line.split(" - ", 1)[1].split()
        mounted = {at: names for at, names in mounted.items()
                   if at != point and not at.startswith(point.rstrip("/") + "/")}
        read_only = "ro" in fields[5].split(",") or (len(after) >= 3 and "ro" in after[2].split(","))
        if len(after) >= 3 and after[0] == "cgroup" and not read_only:
            mounted[point] = frozenset(after[2].split(",")) - _NOT_CONTROLLERS
    return mounted


def crun_directory(controllers: str, cgroup_root: str = CGROUP_ROOT) -> str:
    """Where crun enters a v1 hierarchy (libcrun enter_cgroup_v1): its controllers' line, name= taken off."""
    name = controllers.removeprefix("name=")
    name = {"net_prio,net_cls": "net_cls,net_prio", "cpuacct,cpu": "cpu,cpuacct"}.get(name, name)
    return f"{cgroup_root}/{name}"


def _entered_by_crun(controllers: str, mounted: dict[str, frozenset[str]], cgroup_root: str) -> bool:
    """Whether the hierarchy of `controllers` is mounted where crun enters it (the unified one, '', always is)."""
    return not controllers or frozenset(controllers.split(",")) <= mounted.get(
        crun_directory(controllers, cgroup_root), frozenset())


def unmounted_hierarchies(proc_cgroup: str, mountinfo: str, cgroup_root: str = CGROUP_ROOT) -> list[str]:
    """Every v1 hierarchy in proc_cgroup that is not mounted where crun enters it, newest first: one
    mounted elsewhere, even below cgroup_root, leaves crun's proxy in that hierarchy's root."""
    mounted = _cgroup_mounts(mountinfo)
    return [parts[1] for line in proc_cgroup.splitlines()
            if len(parts := line.split(":", 2)) == 3 and not _entered_by_crun(parts[1], mounted, cgroup_root)]


def crun_proxy_hierarchy(proc_cgroup: str, mountinfo: str, cgroup_root: str = CGROUP_ROOT) -> str | None:
    """The hierarchy crun's restore proxy would take for its own when it is not mounted where crun enters
    it ('perf_event', 'name=x'), else None. Both texts as /proc/self/{cgroup,mountinfo} hold them."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or parts[1] == "memory":
            continue  # crun skips exactly memory
        return None if _entered_by_crun(parts[1], _cgroup_mounts(mountinfo), cgroup_root) else parts[1]
    return None


def stale_hierarchy_for_crun(cgroup_root: str = CGROUP_ROOT) -> str | None:
    """crun_proxy_hierarchy for this process, on a host whose cgroups are v1 or hybrid."""
    if not hybrid_or_legacy(cgroup_root):
        return None
    return crun_proxy_hierarchy(*_own_cgroups_and_mounts(), cgroup_root)


def stale_hierarchies(cgroup_root: str = CGROUP_ROOT) -> list[str]:
    """unmounted_hierarchies for this process, on a host whose cgroups are v1 or hybrid."""
    if not hybrid_or_legacy(cgroup_root):
        return []
    return unmounted_hierarchies(*_own_cgroups_and_mounts(), cgroup_root)


def _own_cgroups_and_mounts() -> tuple[str, str]:
    with open("/proc/self/cgroup") as cgroups, open("/proc/self/mountinfo") as mounts:
        return cgroups.read(), mounts.read()


def hierarchies_a_restore_would_leave(image_hierarchies: list[str], mountinfo: str,
                                      cgroup_root: str = CGROUP_ROOT) -> list[str]:
    """Of the v1 hierarchies a checkpoint's cgroup image lists (CRIU mounts each to restore the processes'
    cgroups, creating it where the node has none), those not mounted where crun enters them: one CRIU
    creates during crun's restore, after any look at /proc/self/cgroup, is the newest, and crun's proxy
    takes its root for its own cgroup."""
    mounted = _cgroup_mounts(mountinfo)
    return [controllers for controllers in image_hierarchies if not _entered_by_crun(controllers, mounted, cgroup_root)]


def crun_restore_hazard(image_hierarchies: list[str], cgroup_root: str = CGROUP_ROOT) -> str | None:
    """Why crun's restore of a checkpoint with these cgroup hierarchies would kill every process on this
    node (one line), or None: on cgroup v2 hosts never (crun's proxy reads its own cgroup v2 line)."""
    if not hybrid_or_legacy(cgroup_root):
        return None
    proc_cgroup, mountinfo = _own_cgroups_and_mounts()
    if stale := crun_proxy_hierarchy(proc_cgroup, mountinfo, cgroup_root):
        return f"the cgroup v1 hierarchy '{stale}' is not mounted at {crun_directory(stale, cgroup_root)}"
    if missing := hierarchies_a_restore_would_leave(image_hierarchies, mountinfo, cgroup_root):
        return (f"the checkpoint's cgroup image lists the cgroup v1 hierarchy '{missing[0]}', not mounted at "
                f"{crun_directory(missing[0], cgroup_root)} here, which CRIU would make during the restore")
    return None
