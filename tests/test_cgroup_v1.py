"""Which cgroup v1 hierarchy crun's restore proxy takes for its own, as /proc shows it (texts seen on the
2-core test VM: cgroup v1 hybrid, perf_event and net_cls,net_prio left behind by a container's systemd)."""

from __future__ import annotations

import pytest

from gpuckpt.host.cgroup_v1 import crun_proxy_hierarchy, hierarchies_a_restore_would_leave, unmounted_hierarchies

MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 / /sys/fs/cgroup/hugetlb rw,relatime - cgroup cgroup rw,hugetlb
43 31 0:40 / /sys/fs/cgroup/net_cls,net_prio rw,relatime - cgroup cgroup rw,net_cls,net_prio
"""
CLEAN = "10:hugetlb:/\n9:name=systemd:/\n6:freezer:/\n4:memory:/process_api/x\n1:cpu:/\n0::/\n"


def test_every_hierarchy_mounted_is_safe() -> None:
    assert crun_proxy_hierarchy(CLEAN, MOUNTS) is None
    assert crun_proxy_hierarchy("13:net_cls,net_prio:/\n" + CLEAN, MOUNTS) is None  # mounted as a pair


@pytest.mark.parametrize(("first", "named"), [
    ("15:perf_event:/\n", "perf_event"),
    ("16:name=gpuckpt-stale:/\n", "name=gpuckpt-stale"),
    ("15:perf_event:/\n4:memory:/\n", "perf_event"),
])
def test_the_newest_hierarchy_mounted_nowhere_is_named(first: str, named: str) -> None:
    assert crun_proxy_hierarchy(first + CLEAN, MOUNTS) == named


def test_memory_is_skipped_as_crun_skips_it() -> None:
    assert crun_proxy_hierarchy("4:memory:/x\n15:perf_event:/\n" + CLEAN, MOUNTS) == "perf_event"
    assert crun_proxy_hierarchy("11:memory:/x\n" + CLEAN, MOUNTS) is None


def test_a_mount_outside_the_cgroup_root_does_not_count() -> None:
    elsewhere = MOUNTS + "90 1 0:50 / /tmp/yard rw,relatime - cgroup cgroup rw,perf_event\n"
    assert crun_proxy_hierarchy("15:perf_event:/\n" + CLEAN, elsewhere) == "perf_event"


def test_a_stale_hierarchy_older_than_a_mounted_one_is_not_crun_s_choice() -> None:
    # crun takes the first line that is not memory: hugetlb here, mounted, so its proxy finds its own cgroup
    older = "10:hugetlb:/\n7:perf_event:/\n4:memory:/x\n1:cpu:/\n0::/\n"
    assert crun_proxy_hierarchy(older, MOUNTS) is None


def test_every_unmounted_hierarchy_is_listed_newest_first() -> None:
    text = "16:name=left:/\n15:perf_event:/\n" + CLEAN.replace("6:freezer", "7:blkio:/\n6:freezer")
    assert unmounted_hierarchies(text, MOUNTS) == ["name=left", "perf_event", "blkio"]
    assert unmounted_hierarchies(CLEAN, MOUNTS) == []


@pytest.mark.parametrize(("mount_point", "options"), [
    ("/sys/fs/cgroup/name=yard", "rw,name=yard"),  # crun strips name=: it looks for /sys/fs/cgroup/yard
    ("/sys/fs/cgroup/elsewhere", "rw,name=yard"),
    ("/sys/fs/cgroup/yard/nested", "rw,name=yard"),
])
def test_a_hierarchy_below_the_cgroup_root_but_not_where_crun_looks_is_crun_s_unmounted_one(mount_point,
                                                                                              options) -> None:
    # crun enters a v1 hierarchy only at /sys/fs/cgroup/<its controllers, name= stripped>
    # (libcrun enter_cgroup_v1); its proxy stays in the root of any other, and destroys that
    mounts = MOUNTS + f"91 31 0:51 / {mount_point} rw,relatime - cgroup cgroup {options}\n"
    assert crun_proxy_hierarchy("16:name=yard:/\n" + CLEAN, mounts) == "name=yard"


def test_a_named_hierarchy_at_its_name_and_a_pair_crun_spells_its_way_are_where_crun_looks() -> None:
    mounts = MOUNTS + "91 31 0:51 / /sys/fs/cgroup/yard rw,relatime - cgroup cgroup rw,name=yard\n"
    assert crun_proxy_hierarchy("16:name=yard:/\n" + CLEAN, mounts) is None
    assert crun_proxy_hierarchy("13:net_cls,net_prio:/\n" + CLEAN, MOUNTS) is None


def test_a_checkpoint_listing_a_hierarchy_this_node_lacks_is_named() -> None:
    # as a podman 4.3 container's cgroup.img on the CI machine lists them ('' is the unified hierarchy)
    listed = ["hugetlb", "memory", "cpu", "freezer", "", "name=systemd"]
    assert hierarchies_a_restore_would_leave(listed, MOUNTS) == []
    assert hierarchies_a_restore_would_leave([*listed, "perf_event", "name=elsewhere"], MOUNTS) == [
        "perf_event", "name=elsewhere"]
    moved = MOUNTS.replace("/sys/fs/cgroup/freezer", "/sys/fs/cgroup/other")  # crun looks only at its own place
    assert hierarchies_a_restore_would_leave(listed, moved) == ["freezer"]


@pytest.mark.parametrize("hiding", [
    "92 32 0:60 / /sys/fs/cgroup/cpu rw,relatime - tmpfs tmpfs rw\n",  # over it: crun's mkdir lands in the tmpfs
    "92 23 0:60 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw\n",  # over every hierarchy below
    "92 31 0:29 / /sys/fs/cgroup/cpu ro,relatime - cgroup cgroup rw,cpu\n",  # crun skips EROFS, proxy in '/'
])
def test_a_hierarchy_hidden_by_a_later_mount_or_read_only_is_not_entered_by_crun(hiding: str) -> None:
    hidden_first = "/sys/fs/cgroup " in hiding  # hugetlb, CLEAN's first line, hidden too
    assert crun_proxy_hierarchy(CLEAN, MOUNTS + hiding) == ("hugetlb" if hidden_first else None)
    assert crun_proxy_hierarchy("1:cpu:/\n", MOUNTS + hiding) == "cpu"
    assert "cpu" in hierarchies_a_restore_would_leave(["cpu"], MOUNTS + hiding)
    assert "cpu" in unmounted_hierarchies(CLEAN, MOUNTS + hiding)
