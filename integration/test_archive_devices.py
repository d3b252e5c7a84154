"""Devices by identity through `gpuckpt import` (issue 30 item 3), with a real podman export.

The attack seen: an archive whose spec gives the container a node named /dev/nvidia-rt that is
type c 1:11 (the host's /dev/kmsg) and a cgroup rule allowing it; the old check passed any path
starting with /dev/nvidia, and the container wrote into the host's kernel log. The same archive
unedited (a plain `podman run`'s spec: podman's deny-all rule, runc's defaults) imports.
"""

from __future__ import annotations

import json
import tarfile

import pytest
import test_archives
import zstandard
from bed import GPUCKPT, assert_continues, edited_archive, edited_specs, sh, staging_leftovers, wait_counter
from test_archives import podman_made, read_state, start_counter

unsigned_allowed = test_archives.unsigned_allowed  # podman's own archives are unsigned (fixture)
KMSG_NODE = {"path": "/dev/nvidia-rt", "type": "c", "major": 1, "minor": 11, "fileMode": 438, "uid": 0, "gid": 0}
KMSG_RULE = {"allow": True, "type": "c", "major": 1, "minor": 11, "access": "rwm"}


def with_kmsg(spec: dict) -> dict:
    linux = spec.setdefault("linux", {})
    linux["devices"] = [*(linux.get("devices") or []), KMSG_NODE]
    resources = linux.setdefault("resources", {})
    resources["devices"] = [*(resources.get("devices") or []), KMSG_RULE]
    return spec




@pytest.mark.hostile("a real podman export whose spec.dump and config.dump give /dev/nvidia-rt, c 1:11 (the host's "
                     "/dev/kmsg), and a cgroup rule allowing it")
def test_a_device_named_like_nvidia_is_refused_by_its_numbers(runc_delegate, tmp_path, unsigned_allowed) -> None:
    name = start_counter([])
    archive, edited = tmp_path / "plain.tar.zst", tmp_path / "kmsg.tar.zst"
    try:
        before = wait_counter(read_state(name), minimum=3)
        sh("podman", "container", "checkpoint", "--export", str(archive), name)
        sh("podman", "rm", "-f", name)
        edited_archive(archive, edited, edited_specs(with_kmsg))
        shown = json.loads(sh(GPUCKPT, "inspect", "--json", str(edited)).stdout)
        assert shown["container"]["name"] == name  # a well-formed archive, as podman would take it
        with open(edited, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as source, \
                tarfile.open(fileobj=source, mode="r|") as tar:
            spec = next(json.load(tar.extractfile(m)) for m in tar if m.name == "spec.dump")
        # the check this replaces passed any device whose path starts with /dev/nvidia, and read no cgroup rule
        assert all(device["path"].startswith("/dev/nvidia") for device in spec["linux"]["devices"])

        refused = sh(GPUCKPT, "import", str(edited), check=False)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        line = refused.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert "host devices in spec.dump (/dev/nvidia-rt (c 1:11), cgroup rule allow c 1:11 rwm; allowed: this " \
               "node's NVIDIA devices (" in line, line
        assert "import.allowed_devices" in line and line.endswith("--trust-config if you trust where the archive "
                                                                   "comes from)"), line
        assert not podman_made(name) and staging_leftovers() == []

        sh(GPUCKPT, "import", str(archive))  # the same export unedited: podman's own rules pass
        assert_continues(before, read_state(name))
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
