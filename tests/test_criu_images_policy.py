"""The image policy: what CRIU would restore, against what the container's spec grants."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from criu_image_builder import BASE_SPEC, DEFAULT_CAPS, REAL_DUMP, ImageBuilder, spec

from gpuckpt.errors import ImageError
from gpuckpt.oci.criu_images import directory_source, read_checkpoint_images
from gpuckpt.policy.image import CAP_NUMBERS, check_archive, check_restore, refusals

ALL_CAPS = frozenset(range(41))
DEFAULT_NAMES = sorted(name for name, number in CAP_NUMBERS.items() if number in DEFAULT_CAPS)


def caps(names=DEFAULT_NAMES, **sets) -> dict:
    return {"bounding": list(names), "effective": list(names), "permitted": list(names), **sets}


def images(tmp_path: Path, **creds_fields):
    build = ImageBuilder(tmp_path / "images")
    build.checkpoint(build.creds(**creds_fields))
    return read_checkpoint_images(directory_source(str(build.dir)), "images")


def test_an_honest_podman_dump_passes_its_own_spec() -> None:
    real = read_checkpoint_images(directory_source(str(REAL_DUMP)), "real")
    assert refusals(real, spec()) == []


@pytest.mark.hostile("CRIU images with every capability under a spec granting podman's defaults")
def test_capabilities_beyond_the_spec_are_named_with_what_it_allows(tmp_path: Path) -> None:
    found = refusals(images(tmp_path, caps=ALL_CAPS), spec())
    assert found[0].startswith("process 1 (sleep): effective capabilities hold CAP_DAC_READ_SEARCH, ")
    assert "the spec allows at most CAP_CHOWN, CAP_DAC_OVERRIDE" in found[0]
    assert [line.split(": ")[1].split()[0] for line in found] == ["effective", "permitted", "bounding"]


def test_dropped_capabilities_are_not_a_refusal(tmp_path: Path) -> None:
    assert refusals(images(tmp_path, caps={0, 5}), spec()) == []


def test_file_capabilities_reach_the_bounding_set_unless_no_new_privs(tmp_path: Path) -> None:
    """Without noNewPrivileges an execve of a setuid-root program raises permitted to bounding."""
    narrow = caps(effective=["CAP_KILL"], permitted=["CAP_KILL"])
    held = images(tmp_path, caps=DEFAULT_CAPS, no_new_privs=1)
    assert refusals(held, spec(process_capabilities=narrow)) == []
    found = refusals(held, spec(process_capabilities=narrow, process_noNewPrivileges=True))
    assert found and "the spec's permitted set" in found[0]


@pytest.mark.hostile("image without no_new_privs under a spec that sets noNewPrivileges")
def test_no_new_privs_must_stay_set(tmp_path: Path) -> None:
    found = refusals(images(tmp_path), spec(process_noNewPrivileges=True))
    assert found == ["process 1 (sleep): no_new_privs off, the spec sets noNewPrivileges"]


@pytest.mark.hostile("image running as uid 0 where the spec's user is 1000 with no_new_privs")
def test_uid_zero_is_refused_only_where_the_spec_cannot_reach_it(tmp_path: Path) -> None:
    user = {"uid": 1000, "gid": 1000, "additionalGids": [1000]}
    no_setuid = caps([name for name in DEFAULT_NAMES if name not in ("CAP_SETUID", "CAP_SETGID")])
    root = images(tmp_path, caps=set(), no_new_privs=1)
    found = refusals(root, spec(process_user=user, process_capabilities=no_setuid, process_noNewPrivileges=True))
    assert found[0] == ("process 1 (sleep): uid 0, the spec runs it as uid 1000 with noNewPrivileges and "
                        "without CAP_SETUID")
    assert "gid/groups 0" in found[1]
    # a setuid program reaches root without noNewPrivileges; CAP_SETUID reaches any uid
    assert refusals(root, spec(process_user=user, process_capabilities=no_setuid)) == []
    assert refusals(root, spec(process_user=user, process_noNewPrivileges=True)) == []


@pytest.mark.hostile("image of a thread outside seccomp under a spec that has linux.seccomp")
def test_seccomp_must_stay_on(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint(seccomp=False)
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert refusals(held, spec()) == ["process 1 (sleep): no seccomp filter, the spec gives the container one "
                                      "(linux.seccomp)"]
    assert refusals(held, spec(linux_seccomp=None)) == []


@pytest.mark.hostile("image with securebits set and no CAP_SETPCAP in the spec")
def test_securebits_need_setpcap(tmp_path: Path) -> None:
    held = images(tmp_path, caps={0}, secbits=0x2f)
    assert refusals(held, spec()) == []  # podman's defaults include CAP_SETPCAP
    no_setpcap = caps([name for name in DEFAULT_NAMES if name != "CAP_SETPCAP"])
    assert refusals(held, spec(process_capabilities=no_setpcap)) == [
        "process 1 (sleep): securebits 0x2f, the spec gives none and no CAP_SETPCAP to set them"]


@pytest.mark.hostile("image whose process is in the dumping node's mount namespace")
def test_a_process_in_the_dumpers_namespace_is_refused(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint(task_ids=build.ids(100, user=6, mnt=5))  # the inventory's root_ids mnt is 5
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert refusals(held, spec()) == ["process 1 (sleep): its mount namespace is the one CRIU dumped from "
                                      "(the node's), the spec gives the container a new one"]
    host_mounts = [ns for ns in BASE_SPEC["linux"]["namespaces"] if ns["type"] != "mount"]
    assert refusals(held, spec(linux_namespaces=host_mounts)) == []


@pytest.mark.hostile("image with a user namespace mapping container root to host root")
def test_user_namespace_maps_must_lie_within_the_spec(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint(task_ids=build.ids(100))
    extent = build.pb.userns.DESCRIPTOR.fields_by_name["uid_map"].message_type._concrete_class
    build.write("userns-106.img", "USERNS", build.pb.userns(uid_map=[extent(first=0, lower_first=0, count=65536)],
                                                            gid_map=[extent(first=0, lower_first=100000, count=65536)]))
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert refusals(held, spec()) == ["process 1 (sleep): a user namespace of its own (id maps from the image), "
                                      "the spec gives none"]
    with_userns = spec(linux_namespaces=[*BASE_SPEC["linux"]["namespaces"], {"type": "user"}],
                       linux_uidMappings=[{"containerID": 0, "hostID": 100000, "size": 65536}],
                       linux_gidMappings=[{"containerID": 0, "hostID": 100000, "size": 65536}])
    assert refusals(held, with_userns) == ["process 1 (sleep): its user namespace maps uids 0-65535 to host 0-65535, "
                                           "beyond the spec's uidMappings"]


@pytest.mark.hostile("core image of a live task without credentials")
def test_a_live_task_without_credentials_is_refused_a_zombie_is_not(tmp_path: Path) -> None:
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    build.write("core-1.img", "CORE", build.core(thread_core=False))
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert "no credentials in its core image" in refusals(held, spec())[0]
    build.write("core-1.img", "CORE", build.core(build.creds(caps=ALL_CAPS), state=2))
    assert refusals(read_checkpoint_images(directory_source(str(tmp_path)), "images"), spec()) == []


def test_a_spec_without_capabilities_sets_no_capability_limit(tmp_path: Path) -> None:
    assert refusals(images(tmp_path, caps=ALL_CAPS), spec(process_capabilities=None)) == []


def bundle_with(tmp_path: Path, raw: dict) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(raw))
    return bundle


@pytest.mark.hostile("restore bundle whose CRIU images hold every capability")
def test_the_shims_check_is_one_line_naming_the_container(tmp_path: Path) -> None:
    shutil.copytree(REAL_DUMP, tmp_path / "honest")
    bundle = bundle_with(tmp_path, BASE_SPEC)
    check_restore(str(tmp_path / "honest"), str(bundle), "restore of c1")
    build = ImageBuilder(tmp_path / "edited")
    build.checkpoint(build.creds(caps=ALL_CAPS))
    with pytest.raises(ImageError) as refused:
        check_restore(str(build.dir), str(bundle), "restore of c1")
    line = str(refused.value)
    assert line.startswith("restore of c1: the checkpoint holds more than the container's spec grants: process 1 "
                           "(sleep): effective capabilities hold CAP_DAC_READ_SEARCH")
    assert line.endswith("(and 2 more): refused") and "\n" not in line


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.hostile("archive whose spec.dump was edited back to defaults, CRIU images left with every capability")
def test_an_archives_images_are_checked_against_its_spec_dump(tmp_path: Path) -> None:
    dump = {f"checkpoint/{path.name}": path.read_bytes() for path in REAL_DUMP.glob("*.img")}
    spec_dump = json.dumps(BASE_SPEC).encode()
    honest = tmp_path / "honest.tar"
    honest.write_bytes(tar_of({"config.dump": b"{}", "spec.dump": spec_dump, **dump, "checkpoint/pages-1.img": b"x"}))
    check_archive(str(honest), spec_dump, "honest.tar")
    build = ImageBuilder(tmp_path / "edited")
    build.checkpoint(build.creds(caps=ALL_CAPS))
    edited = tmp_path / "edited.tar"
    edited.write_bytes(tar_of({"spec.dump": spec_dump, **{f"checkpoint/{p.name}": p.read_bytes()
                                                          for p in build.dir.iterdir()}}))
    with pytest.raises(ImageError, match=r"^edited.tar: the checkpoint holds more than the container's spec grants: "
                                         r"process 1 \(sleep\): effective capabilities hold CAP_DAC_READ_SEARCH"):
        check_archive(str(edited), spec_dump, "edited.tar")


def test_an_image_dir_without_inventory_is_left_to_the_delegate(tmp_path: Path) -> None:
    """CRIU reads inventory.img first and restores nothing without it; runc reports that itself."""
    (tmp_path / "images").mkdir()
    check_restore(str(tmp_path / "images"), str(tmp_path / "no-bundle"), "restore of c1")


@pytest.mark.hostile("checkpoint directory given as a symlink")
def test_an_image_dir_reached_through_a_link_is_refused(tmp_path: Path) -> None:
    shutil.copytree(REAL_DUMP, tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ImageError, match="cannot open the checkpoint directory"):
        check_restore(str(tmp_path / "link"), str(bundle_with(tmp_path, BASE_SPEC)), "restore of c1")


@pytest.mark.hostile("pstree threads of a zombie that have no core image (a task that ended mid-dump)")
def test_a_zombie_is_read_from_its_own_core_whatever_threads_pstree_lists(tmp_path: Path) -> None:
    """CRIU restores a zombie from core-<pid>.img alone; a fast-forking container's dump can list a thread id for
    it that has no core (seen: runc restores it, the shim refused "core-<id>.img: missing"). A live task's
    listed thread without a core is still refused."""
    build = ImageBuilder(tmp_path)
    build.checkpoint()
    build.write("pstree.img", "PSTREE", build.pb.pstree(pid=1, ppid=0, pgid=1, sid=1, threads=[1]),
                build.pb.pstree(pid=7, ppid=1, pgid=1, sid=1, threads=[2_000_000_123]))
    build.write("core-7.img", "CORE", build.core(state=2, thread_core=False))
    held = read_checkpoint_images(directory_source(str(tmp_path)), "images")
    assert [(task.pid, task.state, [thread.tid for thread in task.threads]) for task in held.tasks] == [
        (1, 1, [1]), (7, 2, [7])]
    assert refusals(held, spec()) == []
    build.write("core-7.img", "CORE", build.core(state=1))
    with pytest.raises(ImageError, match="core-2000000123.img: missing"):
        read_checkpoint_images(directory_source(str(tmp_path)), "images")
