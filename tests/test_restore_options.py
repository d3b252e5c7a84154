"""podman's restore options as `gpuckpt import` passes them: allow-listed values, podman's words, and what
--ignore-rootfs / --ignore-volumes leave unstaged (so the shim applies none of it)."""

from __future__ import annotations

import io
import tarfile

import pytest
from podman_tars import podman_tar

from gpuckpt.errors import UsageError
from gpuckpt.node.config import ImportConfig
from gpuckpt.oci.podman_archive import copy_checked
from gpuckpt.transfer.bounds import StagingBudget
from gpuckpt.transfer.restore_options import RestoreOptions, check_publish, refuse_pod_mismatch, require_supported
from gpuckpt.transfer.staging import Staging


@pytest.mark.parametrize("value", ["80", "8080:80", "127.0.0.1:8080:80", "127.0.0.1::80", "[::1]:8080:80/udp",
                                   "8000-8010:9000-9010/tcp", "9000-9010", ":80", "80/sctp"])
def test_podmans_publish_forms_pass(value: str) -> None:
    check_publish(value)


@pytest.mark.parametrize(("value", "why"), [
    ("80 --privileged", "not of that form"), ("--privileged", "not of that form"), ("0:80", "host port 0"),
    ("80:65536", "container port 65536"), ("300.1.1.1:80:80", "300.1.1.1 is not an IP address"),
    ("8000-8010:80-81", "ranges differ"), ("80/icmp", "not of that form"), ("80:80\n", "not of that form"),
    ("90-80:90-80", "port 90-80"), ("", "not of that form")])
def test_other_publish_values_are_refused_naming_why(value: str, why: str) -> None:
    with pytest.raises(UsageError) as refused:
        check_publish(value)
    assert why in str(refused.value) and "give [[IP:][HOST_PORT]:]CONTAINER_PORT" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_each_value_is_joined_to_its_flag() -> None:
    chosen = RestoreOptions(name="web2", publish=("8080:80", "127.0.0.1::81"), pod="p1", keep=True,
                            ignore_rootfs=True, ignore_volumes=True, ignore_static_ip=True,
                            ignore_static_mac=True, tcp_established=True)
    assert chosen.flags() == ["--name=web2", "--tcp-established", "--ignore-static-ip", "--ignore-static-mac",
                              "--keep", "--ignore-rootfs", "--ignore-volumes", "--publish=8080:80",
                              "--publish=127.0.0.1::81", "--pod=p1"]
    assert RestoreOptions().flags() == []
    # podman 4.3's restore takes the pod's name for its ID: it is given the ID require_pod found
    assert RestoreOptions(pod="p1", pod_id="ab" * 32).flags() == [f"--pod={'ab' * 32}"]


def test_a_pod_is_asked_for_exactly_when_the_archive_was_in_one() -> None:
    """podman's own rule, said from config.dump's `pod` before anything is staged (it says it after)."""
    refuse_pod_mismatch("web.tar.zst", "", None)
    refuse_pod_mismatch("web.tar.zst", "cd" * 32, "p1")
    with pytest.raises(UsageError, match=r"^web.tar.zst: its container was in a pod \(ID cdcdcdcdcdcd\): .*give "
                                         r"--pod POD, an existing pod"):
        refuse_pod_mismatch("web.tar.zst", "cd" * 32, None)
    with pytest.raises(UsageError, match=r"^--pod p1: the container of web.tar.zst was in no pod.*leave --pod out$"):
        refuse_pod_mismatch("web.tar.zst", "", "p1")


@pytest.mark.parametrize("options", [RestoreOptions(name="-x"), RestoreOptions(pod="a b"),
                                     RestoreOptions(name="web/../x"), RestoreOptions(publish=("a",))])
def test_a_bad_name_pod_or_publish_is_one_line(options: RestoreOptions) -> None:
    with pytest.raises(UsageError) as refused:
        options.check()
    assert "\n" not in str(refused.value)


def _tar(name: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return out.getvalue()


ROOT_ENTRIES = [("rootfs-diff.tar", _tar("etc/motd")), ("deleted.files", b'["/etc/issue"]'),
                ("volumes/data.tar", _tar("file"))]


@pytest.mark.parametrize(("rootfs", "volumes", "staged"), [
    (False, False, ["rootfs-diff.tar", "deleted.files", "volumes/data.tar"]),
    (True, False, ["volumes/data.tar"]), (False, True, ["rootfs-diff.tar", "deleted.files"]), (True, True, [])])
def test_ignored_root_files_are_not_staged_so_the_shim_applies_none(tmp_path, rootfs, volumes, staged) -> None:
    (tmp_path / "storage").mkdir()
    staging = Staging(str(tmp_path / "storage"), StagingBudget("a.tar", str(tmp_path / "storage"), ImportConfig()))
    staging.ignore_rootfs, staging.ignore_volumes = rootfs, volumes
    staging.start()
    light = io.BytesIO()
    try:
        copy_checked(io.BytesIO(podman_tar(ROOT_ENTRIES)), light, "a.tar", kept={}, divert=staging.divert,
                     trailer=staging.trailer)
        assert staging.root_files == staged  # what the shim's record names: all it applies
        files = {name for name in ("rootfs-diff.tar", "deleted.files", "volumes-data.tar")
                 if (tmp_path / "storage" / staging.directory / name).exists()}
        assert files == {name.replace("/", "-") for name in staged}
        with tarfile.open(fileobj=io.BytesIO(light.getvalue())) as tar:
            given = {member.name: member.size for member in tar}
        assert "rootfs-diff.tar" not in given and "deleted.files" not in given  # podman never gets them
        assert given["volumes/data.tar"] == 10240  # an empty tar either way: podman 4.3 wants one per volume
    finally:
        staging.remove()


OLD_PODMAN_HELP = """Options:
      --ignore-rootfs            Do not apply root file-system changes when importing from exported checkpoint
  -i, --import string            Restore from exported checkpoint archive (tar.gz)
  -k, --keep                     Keep all temporary checkpoint files
  -n, --name string              Specify new name for container restored from exported checkpoint
      --tcp-established          Restore a container with established TCP connections
"""


def test_an_option_the_installed_podman_lacks_is_refused_naming_its_version(tmp_path) -> None:
    """A stand-in for an older podman (a program printing such a podman's help and version, as podman 2.x's
    restore lacked --pod, --publish and the static address options): only what its help lists is passed."""
    help_file = tmp_path / "help.txt"
    help_file.write_text(OLD_PODMAN_HELP)
    older = tmp_path / "podman"
    older.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "podman version 2.2.1" && exit 0\ncat {help_file}\n')
    older.chmod(0o755)
    require_supported(str(older), RestoreOptions(name="web2", keep=True, ignore_rootfs=True))  # all listed
    with pytest.raises(UsageError) as refused:
        require_supported(str(older), RestoreOptions(publish=("8080:80",), pod="p1", keep=True))
    assert str(refused.value) == ("--publish, --pod: podman 2.2.1's `container restore` has no such option: leave "
                                  "them out, or upgrade podman")
