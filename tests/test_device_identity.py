"""Devices of an imported spec by identity (policy/devices.py): a node named /dev/nvidia-rt that is
the host's /dev/kmsg, its cgroup rule, a block device, all refused; this node's own NVIDIA nodes
(as its /dev has them), runc's defaults and the operator's allow-list accepted."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import test_gpu_verbs
from podman_tars import CONFIG, PODMAN_LINUX, podman_tar
from test_gpu_verbs import checkpointed_node, restore_args

from gpuckpt.cuda.node import NodeGpus
from gpuckpt.errors import ConfigError, ImageError
from gpuckpt.node.config import load_config
from gpuckpt.oci.podman_archive import check_podman_archive
from gpuckpt.oci.spec import Spec
from gpuckpt.policy.archive_import import import_refusals
from gpuckpt.policy.devices import DeviceAllowance, DeviceId, device_refusals, node_nvidia_devices
from gpuckpt.shim import restore
from gpuckpt.trust.dump_signature import DUMP_SIGNATURE, sign_dump
from gpuckpt.trust.keys import KeyEntry, TrustPolicy, UnsignedSource, ensure_node_key, save_policy
from gpuckpt.trust.signature import public_key_line

make_node = test_gpu_verbs.make_node  # the fake node, its runtime and its driver (fixtures)

PODMAN_ID = "cd" * 32
DENY_ALL = {"allow": False, "access": "rwm"}  # what podman 4.3 and 5 write for a plain `podman run`
# the attack seen: a node "named like NVIDIA's" that is the host's kernel log, and the rule that opens it
KMSG_NODE = {"path": "/dev/nvidia-rt", "type": "c", "major": 1, "minor": 11, "fileMode": 438}
KMSG_RULE = {"allow": True, "type": "c", "major": 1, "minor": 11, "access": "rwm"}


@pytest.fixture
def dev(tmp_path: Path, node, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This node's /dev as the policy reads it: empty (a node without GPUs) until a test links nodes in."""
    directory = tmp_path / "dev"
    directory.mkdir()
    monkeypatch.setenv("GPUCKPT_DEV_DIR", str(directory))
    return directory


def spec_with(devices: list[dict], rules: list[dict]) -> Spec:
    linux = PODMAN_LINUX | {"devices": devices, "resources": {"devices": rules}}
    return Spec.model_validate({"ociVersion": "1.0.2", "linux": linux})


def archive_refusals(tmp_path: Path, devices: list[dict], rules: list[dict]) -> list[str]:
    """import_refusals of a podman archive whose spec.dump and config.dump's spec give these devices and rules."""
    spec = {"ociVersion": "1.0.2", "linux": PODMAN_LINUX | {"devices": devices, "resources": {"devices": rules}}}
    config = json.loads(CONFIG) | {"id": PODMAN_ID, "spec": spec}
    path = tmp_path / "a.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(spec).encode()))
    return import_refusals(check_podman_archive(str(path)))


def prefix_rule_refusals(spec: Spec) -> list[str]:
    """The check this replaces: any device whose path starts with /dev/nvidia, cgroup rules not read."""
    return [device.path for device in spec.linux.devices if not device.path.startswith("/dev/nvidia")]


def real_identity(path: str) -> DeviceId:
    status = os.stat(path)
    assert stat.S_ISCHR(status.st_mode)
    return DeviceId("c", os.major(status.st_rdev), os.minor(status.st_rdev))


@pytest.mark.hostile("an archive whose spec gives /dev/nvidia-rt, type c 1:11 (the host's /dev/kmsg), and a cgroup "
                     "rule allowing it")
def test_a_node_named_like_nvidia_that_is_the_kernel_log_is_refused(tmp_path, dev) -> None:
    if os.path.exists("/dev/kmsg"):
        assert real_identity("/dev/kmsg") == DeviceId("c", 1, 11)  # what the attacker's numbers open on a host
    attack = spec_with([KMSG_NODE], [DENY_ALL, KMSG_RULE])
    assert prefix_rule_refusals(attack) == []  # the name alone passed the old check

    refusals = archive_refusals(tmp_path, [KMSG_NODE], [DENY_ALL, KMSG_RULE])
    assert len(refusals) == 2, refusals  # spec.dump and config.dump's spec, each one line
    line = refusals[0]
    assert line.startswith("host devices in spec.dump (/dev/nvidia-rt (c 1:11), cgroup rule allow c 1:11 rwm; "
                           "allowed: this node's NVIDIA devices (none on this node), runc's defaults"), line
    assert f"import.allowed_devices in {tmp_path}/config.toml" in line and "\n" not in line
    assert refusals[1].startswith("host devices in config.dump (/dev/nvidia-rt (c 1:11)"), refusals


@pytest.mark.hostile("an archive whose spec gives block and loop devices (b 8:0, b 7:0), a cgroup rule for every "
                     "device, a wildcard major, runc's -1 wildcard")
@pytest.mark.parametrize(("devices", "rules", "named"), [
    ([{"path": "/dev/nvidia-disk", "type": "b", "major": 8, "minor": 0}], [], "/dev/nvidia-disk (b 8:0)"),
    ([{"path": "/dev/nvidia7", "type": "b", "major": 7, "minor": 0}], [], "/dev/nvidia7 (b 7:0)"),
    ([], [{"allow": True, "access": "rwm"}], "cgroup rule allow a *:* rwm"),
    ([], [{"allow": True, "type": "c", "minor": 11, "access": "rw"}], "cgroup rule allow c *:11 rw"),
    ([], [{"allow": True, "type": "b", "major": -1, "minor": -1, "access": "rwm"}], "cgroup rule allow b *:* rwm"),
    ([], [{"allow": True, "type": "c", "major": 136, "minor": -1, "access": "rwmx"}], "cgroup rule allow c 136:* rwmx"),
    ([{"path": "/dev/nvidiactl", "type": "c"}], [], "/dev/nvidiactl (c *:*)"),
])
def test_other_devices_and_rules_are_refused(tmp_path, dev, devices, rules, named) -> None:
    spec = spec_with(devices, rules)
    assert prefix_rule_refusals(spec) == []
    refusals = device_refusals(spec, "spec.dump")
    assert len(refusals) == 1 and refusals[0].startswith(f"host devices in spec.dump ({named}; allowed: "), refusals


def test_this_nodes_own_nvidia_devices_by_number_are_allowed(tmp_path, dev) -> None:
    # the node's /dev/nvidia0 and /dev/nvidia-caps/nvidia-cap1 are real character devices (here: the kernel
    # log and tun, so the test needs no GPU): their numbers pass, under any name; others do not
    if not (os.path.exists("/dev/kmsg") and os.path.exists("/dev/net/tun")):
        pytest.skip("needs /dev/kmsg and /dev/net/tun as real character devices to stand for NVIDIA's")
    (dev / "nvidia0").symlink_to("/dev/kmsg")
    (dev / "nvidia-caps").mkdir()
    (dev / "nvidia-caps" / "nvidia-cap1").symlink_to("/dev/net/tun")
    (dev / "nvidia-uvm").write_text("a regular file is no device")
    assert node_nvidia_devices() == {DeviceId("c", 1, 11), DeviceId("c", 10, 200)}
    gpu = {"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 11}
    assert archive_refusals(tmp_path, [gpu], [DENY_ALL, KMSG_RULE | {"access": "rw"}]) == []
    other = archive_refusals(tmp_path, [gpu, {"path": "/dev/nvidia1", "type": "c", "major": 1, "minor": 12}], [])
    assert other and other[0].startswith("host devices in spec.dump (/dev/nvidia1 (c 1:12); allowed: this node's "
                                         "NVIDIA devices (c 1:11, c 10:200)"), other


def test_podman_runs_own_rules_and_runcs_defaults_pass(tmp_path, dev) -> None:
    runc_defaults = [{"allow": True, "type": kind, "access": "m"} for kind in ("c", "b")] + [
        {"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"}
        for major, minor in ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2), (136, -1), (10, 200))]
    nodes = [{"path": f"/dev/{name}", "type": "c", "major": 1, "minor": minor}
             for name, minor in (("null", 3), ("zero", 5), ("full", 7), ("random", 8), ("urandom", 9))]
    assert archive_refusals(tmp_path, [], [DENY_ALL]) == []  # podman 4.3's spec.dump of a plain run
    assert archive_refusals(tmp_path, nodes, [DENY_ALL, *runc_defaults]) == []
    assert archive_refusals(tmp_path, [], [DENY_ALL, {"allow": False, "type": "b", "major": 8, "access": "rwm"}]) == []


def test_the_operators_allow_list_by_number(tmp_path, dev) -> None:
    fuse = {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}
    assert archive_refusals(tmp_path, [fuse], [])  # not allowed by default
    (tmp_path / "config.toml").write_text('[import]\nallowed_devices = ["c 10:229", "b 7:0"]\n')
    assert archive_refusals(tmp_path, [fuse], [{"allow": True, "type": "c", "major": 10, "minor": 229,
                                                "access": "rw"}]) == []
    assert archive_refusals(tmp_path, [{"path": "/dev/other", "type": "b", "major": 7, "minor": 1}], [])
    assert device_refusals(spec_with([fuse], []), "x", DeviceAllowance(nvidia=(), listed=())) != []


@pytest.mark.parametrize("entry", ["/dev/fuse", "c 10", "x 1:2", "c 1:2 rw", "c -1:2", "c 1:*"])
def test_an_allow_list_entry_not_by_number_is_a_config_error(tmp_path, node, entry) -> None:
    (tmp_path / "config.toml").write_text(f'[import]\nallowed_devices = ["{entry}"]\n')
    with pytest.raises(ConfigError, match=r"import.allowed_devices = .* is not 'c MAJOR:MINOR' or 'b MAJOR:MINOR'"):
        load_config()


# -- the shim's restore: podman's own --import hands it the archive's spec.dump as the bundle --------------------


@pytest.fixture
def restorable(make_node, monkeypatch, dev):
    """A checkpointed fake GPU container (signed by this node's key), its bundle given `devices` and `rules`."""
    node = checkpointed_node(make_node, monkeypatch, 1)

    def bundle_with(devices: list[dict], rules: list[dict]):
        spec = json.loads((node.bundle / "config.json").read_text())
        spec["linux"] = {"devices": devices, "resources": {"devices": rules}}
        (node.bundle / "config.json").write_text(json.dumps(spec))
        return node
    return bundle_with


def restore_refusal(node) -> str | None:
    before = len(node.calls())
    try:
        assert restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus)) == 0
    except ImageError as refused:
        assert len(node.calls()) == before  # the delegate never ran
        return str(refused)
    return None


@pytest.mark.hostile("a dump from another node (unsigned, under restore:any; or signed by another trusted node) "
                     "restored with a bundle giving /dev/nvidia-rt c 1:11 and its cgroup rule (podman --import)")
def test_a_foreign_dumps_bundle_devices_are_checked_by_identity(restorable, tmp_path, monkeypatch) -> None:
    node = restorable([KMSG_NODE], [DENY_ALL, KMSG_RULE])
    # this node's own dump restores with what its checkpointed spec granted, no more (policy/spec_grants.py): the
    # bundle given the device after the checkpoint is refused, by its numbers though its path looks like NVIDIA's
    line = restore_refusal(node)
    assert line is not None and "its spec grants device nodes (/dev/nvidia-rt (c 1:11)); device rules (cgroup rule " \
        "allow c 1:11 rwm), which the checkpointed container did not have" in line, line

    node = restorable([KMSG_NODE], [DENY_ALL, KMSG_RULE])
    (node.images / DUMP_SIGNATURE).unlink()
    save_policy(TrustPolicy(allow_unsigned=[UnsignedSource(source="restore:any", note="test")]))
    line = restore_refusal(node)
    assert line is not None and line.startswith(
        "restore of ctr: a checkpoint not dumped on this node asks for host devices in the restore bundle's "
        "config.json (/dev/nvidia-rt (c 1:11), cgroup rule allow c 1:11 rwm; allowed: this node's NVIDIA devices "
        "(none on this node)"), line
    assert line.endswith(": refused") and "\n" not in line

    own_trust = os.environ["GPUCKPT_TRUST_DIR"]
    monkeypatch.setenv("GPUCKPT_TRUST_DIR", str(tmp_path / "node-b"))  # node B, trusted here, signed this dump
    other, _ = ensure_node_key()
    assert sign_dump(str(node.images)) is not None
    monkeypatch.setenv("GPUCKPT_TRUST_DIR", own_trust)
    save_policy(TrustPolicy(key=[KeyEntry(name="node-b", public_key=public_key_line(other.public))]))
    assert "host devices in the restore bundle's config.json (/dev/nvidia-rt (c 1:11)" in restore_refusal(node)


def test_a_foreign_dump_restores_with_this_nodes_nvidia_devices(restorable, dev) -> None:
    if not os.path.exists("/dev/kmsg"):
        pytest.skip("needs /dev/kmsg as a real character device to stand for NVIDIA's")
    (dev / "nvidia0").symlink_to("/dev/kmsg")
    node = restorable([{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 11}], [DENY_ALL, KMSG_RULE])
    # an unsigned dump's spec is held to podman run's isolation too (policy/archive_import.py
    # unsigned_restore_refusals): the bundle as podman makes it, its devices this test's
    spec = json.loads((node.bundle / "config.json").read_text())
    podman = json.loads((Path(__file__).parent / "data" / "criu-podman-mounts" / "config.json").read_text())
    spec["linux"] |= {key: podman["linux"][key] for key in ("namespaces", "maskedPaths", "readonlyPaths")}
    # the network namespace podman made for that container is not on this node: a new one, as runc makes it
    spec["linux"]["namespaces"] = [{"type": ns["type"]} for ns in spec["linux"]["namespaces"]]
    spec.setdefault("process", {})["capabilities"] = podman["process"]["capabilities"]
    (node.bundle / "config.json").write_text(json.dumps(spec))
    (node.images / DUMP_SIGNATURE).unlink()
    save_policy(TrustPolicy(allow_unsigned=[UnsignedSource(source="restore:any", note="test")]))
    assert restore_refusal(node) is None


@pytest.mark.hostile("a device node at a path that is not that device on this node (runc's restore binds the host's "
                     "file at the device's path: attack30h reached the host's /etc/hosts with /dev/null's numbers)")
@pytest.mark.parametrize("path", ["/etc/hosts", "/dev/shm", "/dev/../etc/hosts", "/dev//null", "/dev/zero"])
def test_an_allowed_number_at_another_path_is_refused(tmp_path, dev, path) -> None:
    refused = archive_refusals(tmp_path, [{"path": path, "type": "c", "major": 1, "minor": 3}], [])
    assert refused and f"{path} (c 1:3, not the device node at that path on this node)" in refused[0], refused
    assert archive_refusals(tmp_path, [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}], []) == []
