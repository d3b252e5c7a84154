"""CRIU's mount and cgroup images against the restore spec (policy/image_mounts.py): a real podman dump restores;
each edit the fourth attacker review (results/lint/attack30d) took host root or wrote a host file with is refused,
naming the mount or the cgroup file."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from gpuckpt.errors import ImageError
from gpuckpt.host.conmon import StorageRoots
from gpuckpt.oci.criu_images import criu_messages
from gpuckpt.oci.spec import Mount, Spec
from gpuckpt.policy.archive_import import unsigned_restore_refusals
from gpuckpt.policy.image import check_restore
from gpuckpt.policy.spec_grants import podman_own_dirs

REAL = Path(__file__).parent / "data" / "criu-podman-mounts"  # podman 4.3 + runc 1.1.5 + CRIU 4.2.1, cgroup v1
MOUNTS = "mountpoints-13.img"
RDONLY = 1


def _entries(data: bytes, message) -> list:
    found, offset = [], 8  # IMG_COMMON, then the image's magic
    while offset < len(data):
        (size,) = struct.unpack_from("<I", data, offset)
        entry = message()
        entry.ParseFromString(data[offset + 4:offset + 4 + size])
        found.append(entry)
        offset += 4 + size
    return found


def _write(path: Path, head: bytes, entries: list) -> None:
    path.write_bytes(head + b"".join(struct.pack("<I", len(raw)) + raw
                                     for raw in (entry.SerializeToString() for entry in entries)))


@pytest.fixture
def dump(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the real dump (images, bundle with its config.json)."""
    images, bundle = tmp_path / "checkpoint", tmp_path / "bundle"
    shutil.copytree(REAL, images)
    bundle.mkdir()
    shutil.move(images / "config.json", bundle / "config.json")
    return images, bundle


def edit_mounts(images: Path, change) -> None:
    """Rewrite the mount image's entries with CRIU's own message: `change(entries)` edits the list in place."""
    data = (images / MOUNTS).read_bytes()
    entries = _entries(data, criu_messages().mount)
    change(entries)
    _write(images / MOUNTS, data[:8], entries)


def at(entries: list, mountpoint: str):
    return next(entry for entry in entries if entry.mountpoint == mountpoint)


def added(entries: list, fstype: int, mountpoint: str, **fields) -> None:
    entry = criu_messages().mount(fstype=fstype, mnt_id=900 + len(entries), root_dev=1,
                                  parent_mnt_id=at(entries, "/").mnt_id, flags=fields.pop("flags", 0),
                                  root=fields.pop("root", "/"),
                                  mountpoint=mountpoint, source=fields.pop("source", "none"), options="", **fields)
    entries.append(entry)


def _clear_rdonly_and_retype(entry) -> None:
    entry.flags &= ~1
    entry.fstype = 5


def refusal(images: Path, bundle: Path) -> str:
    with pytest.raises(ImageError) as refused:
        check_restore(str(images), str(bundle), "restore of c1")
    return str(refused.value)


def test_the_real_podman_dump_restores(dump):
    check_restore(str(dump[0]), str(dump[1]), "restore of c1")  # nothing refused


def _clear_rdonly(entry) -> None:
    entry.flags &= ~RDONLY
    entry.sb_flags &= ~RDONLY


def _rdonly_on_superblock_only(entry) -> None:
    """attack30e sbro: CRIU gives a bind no superblock of its own, so its sb_flags make nothing read-only."""
    entry.flags &= ~RDONLY
    entry.sb_flags |= RDONLY


@pytest.mark.parametrize(("name", "change", "expected"), [
    ("/proc/sys read-write (core_pattern)", lambda e: _clear_rdonly(at(e, "/proc/sys")),
     "/proc/sys (proc) is mounted read-write, which the spec makes read-only"),
    ("/proc/sys read-only on its superblock flags alone", lambda e: _rdonly_on_superblock_only(at(e, "/proc/sys")),
     "/proc/sys (proc) is mounted read-write, which the spec makes read-only"),
    ("/proc/sys's read-only bind dropped", lambda e: e.remove(at(e, "/proc/sys")),
     "/proc/sys is not read-only, which the spec makes it"),
    ("/sys read-write", lambda e: _clear_rdonly(at(e, "/sys")),
     "/sys (sysfs) is mounted read-write, which the spec makes read-only"),
    ("a cgroup hierarchy read-write", lambda e: _clear_rdonly(at(e, "/sys/fs/cgroup/memory")),
     "/sys/fs/cgroup/memory (cgroup) is mounted read-write"),
    ("binfmt_misc", lambda e: added(e, 4, "/mnt"), "/mnt: a binfmt_misc mount, which no runtime makes from a spec"),
    ("tracefs", lambda e: added(e, 19, "/mnt"), "/mnt: a tracefs mount"),
    ("the host's disk by name", lambda e: added(e, 16, "/mnt", fsname="ext4", source="/dev/vda"),
     "/mnt: a ext4 mount CRIU makes by name"),
    ("a second proc, all of it writable", lambda e: added(e, 1, "/mnt/proc"),
     "/mnt/proc: a proc mount where the spec mounts none"),
    ("a writable bind of proc's sys", lambda e: added(e, 1, "/mnt/sys", root="/sys"),
     "/mnt/sys: a bind of proc's '/sys', not read-only at the path it shows"),
    ("a read-only bind of a process's root in proc (attack30g)", lambda e: added(e, 1, "/proc/1/root/etc",
                                                                               root="/1/root/etc", flags=1),
     "a bind of proc's '/1/root/etc', not read-only at the path it shows"),
    ("a bind of part of a tmpfs (attack30g: a link to / in /dev's image)", lambda e: added(e, 5, "/mnt",
                                                                                          root="/l/etc"),
     "/mnt: a bind of tmpfs's '/l/etc' (only whole ones)"),
    ("a pty bound anywhere but at /dev/console", lambda e: added(e, 6, "/mnt", root="/0"),
     "/mnt: a bind of devpts's '/0' (only whole ones)"),
    ("the pids hierarchy's runtime source at /mnt (attack30g)", lambda e: added(e, 5, "/mnt",
                                                                                 ext_key="/sys/fs/cgroup/pids"),
     "/mnt: an external mount keyed '/sys/fs/cgroup/pids', the runtime's source for another path"),
    ("conmon's pids hierarchy at its own key, read-write, said to be a tmpfs (attack30h)",
     lambda e: _clear_rdonly_and_retype(at(e, "/sys/fs/cgroup/pids")),
     "/sys/fs/cgroup/pids (tmpfs) is mounted read-write, which the spec makes read-only"),
    ("sysfs below the masked /sys/firmware (attack30h)",
     lambda e: added(e, 2, "/sys/firmware/acpi", root="/firmware/acpi", flags=1),
     "/sys/firmware/acpi is mounted below /sys/firmware, which the spec masks"),
    ("an external mount's key given twice", lambda e: added(e, 0, "/etc/hosts", ext_key="/etc/hosts", flags=1),
     "the runtime's source for '/etc/hosts' mounted twice"),
    ("a mountpoint climbing out", lambda e: added(e, 5, "/../../etc"), "climbs out with '..'"),
    ("/sys/firmware unmasked", lambda e: e.remove(at(e, "/sys/firmware")),
     "/sys/firmware is not masked, which the spec masks"),
])
def test_an_edited_mount_image_is_refused(dump, name, change, expected):
    edit_mounts(dump[0], change)
    line = refusal(*dump)
    assert expected in line and line.startswith("restore of c1: the checkpoint holds more than"), (name, line)
    assert "\n" not in line


def test_a_container_that_may_mount_things_itself_keeps_them_but_not_a_writable_proc_sys(dump):
    """With CAP_SYS_ADMIN (no user namespace) the container could mount binfmt_misc after the restore itself: not
    refused; /proc/sys made writable is the spec's read-only path all the same."""
    spec = json.loads((dump[1] / "config.json").read_text())
    for kind in ("bounding", "effective", "permitted"):
        spec["process"]["capabilities"][kind].append("CAP_SYS_ADMIN")
    (dump[1] / "config.json").write_text(json.dumps(spec))
    edit_mounts(dump[0], lambda e: added(e, 4, "/mnt"))
    check_restore(str(dump[0]), str(dump[1]), "restore of c1")
    edit_mounts(dump[0], lambda e: _clear_rdonly(at(e, "/proc/sys")))
    assert "/proc/sys (proc) is mounted read-write" in refusal(*dump)


def test_a_masked_path_this_kernel_lacks_is_not_asked_for(dump):
    """The spec masks /proc/kcore; a kernel without it has nothing to mask, and the real image has no such mount."""
    spec = json.loads((dump[1] / "config.json").read_text())
    assert "/proc/kcore" in spec["linux"]["maskedPaths"]
    entries = _entries((dump[0] / MOUNTS).read_bytes(), criu_messages().mount)
    assert "/proc/kcore" not in {entry.mountpoint for entry in entries}
    check_restore(str(dump[0]), str(dump[1]), "restore of c1")


def _edit_cgroup(images: Path, change) -> None:
    data = (images / "cgroup.img").read_bytes()
    (entry,) = _entries(data, criu_messages().cgroup)
    change(entry)
    _write(images / "cgroup.img", data[:8], [entry])


def test_a_cgroup_file_named_out_of_criu_s_yard_is_refused(dump):
    """attack30d C1: a property "../../var/tmp/victim" CRIU would chmod and write outside its cgroup yard."""
    def climb(entry) -> None:
        prop = entry.controllers[0].dirs[0].properties.add()
        prop.name, prop.value = "../" * 40 + "var/tmp/victim", "written-by-criu"
    _edit_cgroup(dump[0], climb)
    assert "is not a plain file name" in refusal(*dump)


def test_a_cgroup_directory_climbing_out_is_refused_and_a_mode_is_not_judged(dump):
    """A child directory "../../.." is refused; a mode is not judged: CRIU dumps freezer.state's from memory it never
    set (random set-id bits in real pod members' dumps, attack30e), and inside the yard it reaches nothing."""
    def climb(entry) -> None:
        child = entry.controllers[0].dirs[0].children.add()
        child.dir_name = "../../.."
    _edit_cgroup(dump[0], climb)
    assert "climbs out of CRIU's cgroup yard" in refusal(*dump)
    shutil.copy(REAL / "cgroup.img", dump[0] / "cgroup.img")

    def setuid(entry) -> None:
        entry.controllers[0].dirs[0].properties[0].perms.mode = 0o14301210560
    _edit_cgroup(dump[0], setuid)
    check_restore(str(dump[0]), str(dump[1]), "restore of c1")


def test_an_unsigned_dump_s_spec_cannot_lower_the_default_masking(dump):
    """An unsigned dump's spec (podman's own --import takes it from spec.dump) comes with its images: one that drops
    /proc/sys from readonlyPaths and /sys's "ro", with images to match, is held to every runtime's defaults all
    the same; a signed dump's spec is the checkpointed container's own."""
    spec = json.loads((dump[1] / "config.json").read_text())
    spec["linux"]["readonlyPaths"] = []
    for mount in spec["mounts"]:
        mount["options"] = [option for option in mount["options"] if option != "ro"]
    (dump[1] / "config.json").write_text(json.dumps(spec))

    def writable(entries) -> None:
        _clear_rdonly(at(entries, "/sys"))
        entries.remove(at(entries, "/proc/sys"))
    edit_mounts(dump[0], writable)
    check_restore(str(dump[0]), str(dump[1]), "restore of c1")  # signed: as the spec says
    with pytest.raises(ImageError) as refused:
        check_restore(str(dump[0]), str(dump[1]), "restore of c1", unsigned=True)
    assert "/sys (sysfs) is mounted read-write" in str(refused.value) and "(and 1 more)" in str(refused.value)


def _runc_default_spec() -> Spec:
    """`runc spec` as the runc-level tests use it (a plain runc dump restored under restore:any)."""
    spec = json.loads((REAL / "config.json").read_text())
    spec["mounts"] = [mount for mount in spec["mounts"] if mount["type"] != "bind"]
    spec["linux"]["readonlyPaths"] = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
    spec["linux"]["maskedPaths"] += ["/proc/asound"]  # runc masks it where podman makes it read-only
    spec["linux"].pop("seccomp", None)  # runc's default spec has none
    caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    spec["process"]["capabilities"] = {kind: caps for kind in ("bounding", "effective", "permitted")}
    return Spec.model_validate(spec)


CONTAINER = "267004289df43d2eccd09f8f5cd61e94892e8b720b73583cea11e1aae59a9525"  # the real dump's


def own_storage(spec: Spec, root: Path, container_id: str = CONTAINER) -> tuple[str, ...]:
    """podman's two directories of the container under `root` (graph and run root, as podman makes them), the
    spec's own bind sources moved there: what the shim is given at a restore (policy/spec_grants.py
    podman_own_dirs)."""
    dirs = []
    for store in ("/var/lib/containers/storage", "/run/containers/storage"):
        userdata = root / store.lstrip("/") / "overlay-containers" / container_id / "userdata"
        userdata.mkdir(parents=True)
        dirs.append(str(userdata))
        for mount in spec.mounts:
            prefix = f"{store}/overlay-containers/{container_id}/userdata/"
            if mount.source.startswith(prefix):
                name = mount.source.removeprefix(prefix)
                (userdata / name).mkdir() if name == "shm" else (userdata / name).write_text("")
                mount.source = str(userdata / name)
    return tuple(dirs)


@pytest.mark.parametrize(("name", "change", "expected"), [
    ("the host's disk bound", lambda s: s.mounts.append(Mount(destination="/mnt", source="/", type="bind",
                                                               options=["rbind"])),
     "host bind mounts in the restore bundle's config.json (/)"),
    ("proc mounted again at /mnt", lambda s: s.mounts.append(Mount(destination="/mnt", source="proc", type="proc")),
     "kernel filesystems podman run does not mount"),
    ("CAP_SYS_ADMIN", lambda s: s.process.capabilities.bounding.append("CAP_SYS_ADMIN"),
     "capabilities beyond podman's default in the restore bundle's config.json (CAP_SYS_ADMIN)"),
    ("no capability set", lambda s: setattr(s.process, "capabilities", None), "no capability set"),
    ("/proc/sys not read-only", lambda s: s.linux.readonlyPaths.remove("/proc/sys"),
     "paths podman makes read-only left writable"),
])
def test_an_unsigned_dump_s_spec_is_held_to_what_an_import_holds_spec_dump_to(name, change, expected, tmp_path):
    """attack30e reached host root under restore:any through spec.dump alone (a bind of the host's disk, proc at
    /mnt, CAP_SYS_ADMIN): an unsigned dump's spec comes with it, and is held to `gpuckpt import`'s rules."""
    podman_spec = Spec.model_validate(json.loads((REAL / "config.json").read_text()))
    assert unsigned_restore_refusals(podman_spec, CONTAINER, own_storage(podman_spec, tmp_path)) == []
    assert unsigned_restore_refusals(_runc_default_spec(), "c1", ()) == []  # plain runc: no seccomp, masked asound
    spec = _runc_default_spec()
    change(spec)
    found = unsigned_restore_refusals(spec, "c1", ())
    assert any(expected in problem for problem in found), (name, found)


def test_an_unsigned_dump_binds_nothing_but_files_in_podmans_own_directories_of_it(tmp_path):
    """attack30f: nothing says a volume named in spec.dump is this container's (another tenant's was bound), and
    a path below the container's own directory climbed out with '..' to the host's /. attack30g: a look-alike
    path elsewhere (/tmp, a volume, another container's root, '//' hiding the first marker) made or raced by a
    user or planted by an archive's root entries, and a link planted in the container's own directory."""
    spec = Spec.model_validate(json.loads((REAL / "config.json").read_text()))
    real_sources = [mount.source for mount in spec.mounts]
    own = own_storage(spec, tmp_path)
    assert unsigned_restore_refusals(spec, CONTAINER, own) == []
    assert "host bind mounts" in unsigned_restore_refusals(spec, CONTAINER, ())[0]  # not podman's dirs of it
    lookalike = tmp_path / "tmp" / "x" / "overlay-containers" / CONTAINER / "userdata"
    lookalike.mkdir(parents=True)
    (lookalike / "hosts").write_text("")
    (Path(own[0]) / "planted").symlink_to("/etc")
    for source in ("/var/lib/containers/storage/volumes/v1/_data",
                   f"{own[0]}/../../../../../..", f"{own[0]}//hosts", f"{own[0]}/planted/passwd", f"{own[0]}/planted",
                   str(lookalike / "hosts"), f"{own[1]}/missing",
                   f"{own[0].replace('/overlay-containers/', '/overlay-containers//')}/shm", *real_sources[:1]):
        climbing = spec.model_copy(deep=True)
        climbing.mounts.append(Mount(destination="/x", source=source, type="bind", options=["rbind"]))
        assert "host bind mounts" in unsigned_restore_refusals(climbing, CONTAINER, own)[0], source


def test_podmans_own_directories_are_the_bundle_and_the_run_root_podman_gave_its_conmon():
    graph = f"/var/lib/containers/storage/overlay-containers/{CONTAINER}/userdata"
    run = f"/run/gck/overlay-containers/{CONTAINER}/userdata"
    roots = StorageRoots("/var/lib/containers/storage", "/run/gck")
    assert podman_own_dirs(graph, roots, CONTAINER) == (graph, run)
    assert podman_own_dirs(graph, None, CONTAINER) == (graph,)  # not started by conmon: the bundle only
    assert podman_own_dirs(graph, StorageRoots("/var/tmp/other", "/run/gck"), CONTAINER) == (graph,)  # not its root
    assert podman_own_dirs("/tmp/bundle", roots, CONTAINER) == ()
    assert podman_own_dirs(graph, roots, "c1") == ()  # another container's
    assert podman_own_dirs(graph + "/../userdata", roots, CONTAINER) == ()


def test_a_terminals_console_is_the_containers_pty(dump):
    """runc binds the container's pty (devpts's /N) at /dev/console for a container with a terminal: runc's own
    checkpoint tests restore such containers."""
    edit_mounts(dump[0], lambda e: added(e, 6, "/dev/console", root="/0"))
    check_restore(str(dump[0]), str(dump[1]), "restore of c1", unsigned=True)


def test_cruns_empty_directory_over_a_masked_directory_is_its_mask(dump):
    """crun 1.28 masks a directory with a bind of its own empty directory (ext_key /run/crun/.empty-directory),
    several times over: the runtime's mask, not a source for another path."""
    def crun_masks(entries) -> None:
        for point in ("/proc/scsi", "/sys/firmware"):
            added(entries, 5, point, ext_key="/run/crun/.empty-directory", flags=1)
    edit_mounts(dump[0], crun_masks)
    check_restore(str(dump[0]), str(dump[1]), "restore of c1", unsigned=True)


@pytest.mark.hostile("a runtime's mask (crun's empty directory, runc's /dev/null) mounted where the spec masks nothing "
                     "(attack30j: crun's is one host directory behind every crun container's masks)")
@pytest.mark.parametrize("key", ["/run/crun/.empty-directory", "/dev/null"])
def test_a_runtimes_mask_where_the_spec_masks_nothing_is_refused(dump, key):
    edit_mounts(dump[0], lambda e: added(e, 5, "/mnt", ext_key=key))
    assert f"/mnt: the runtime's mask {key!r} where the spec masks nothing" in refusal(*dump)


@pytest.mark.hostile("a runtime's mask stacked on the spec's /etc/hosts bind and listed before it (attack30k: the mask "
                     "rule read one mount per mountpoint, the last listed, so the key's own mount went unjudged)")
@pytest.mark.parametrize("key", ["/run/crun/.empty-directory", "/dev/null"])
def test_a_runtimes_mask_stacked_on_another_mount_is_judged_too(dump, key):
    def stacked(entries) -> None:
        hosts = at(entries, "/etc/hosts")
        added(entries, 5, "/etc/hosts", ext_key=key)
        mask = entries.pop()
        mask.parent_mnt_id = hosts.mnt_id  # mounted on top of the spec's bind, listed before it
        entries.insert(entries.index(hosts), mask)
    edit_mounts(dump[0], stacked)
    assert f"/etc/hosts: the runtime's mask {key!r} where the spec masks nothing" in refusal(*dump)
