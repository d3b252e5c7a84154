"""--gpu: a podman checkpoint's CDI devices moved onto others of this node in the staged config.dump and spec.dump."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuckpt.errors import ImageError, UsageError
from gpuckpt.oci.podman_archive import CONFIG_DUMP, SPEC_DUMP
from gpuckpt.transfer.gpu_move import GpuMove
from gpuckpt.transfer.restore_options import RestoreOptions

KIND = "example.com/gpu"
# character devices every Linux host has, standing in for GPUs: the move reads their numbers from the host
HOST_NODES = {"0": "/dev/null", "1": "/dev/zero", "2": "/dev/full"}


def numbers(path: str) -> tuple[int, int]:
    rdev = os.stat(path).st_rdev
    return os.major(rdev), os.minor(rdev)


@pytest.fixture
def cdi_dir(tmp_path: Path) -> Path:
    devices = [{"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/fakegpu{name}", "hostPath": host}]}}
               for name, host in HOST_NODES.items()]
    with_files = {"deviceNodes": [{"path": "/dev/fakegpu9", "hostPath": "/dev/null"}],
                  "mounts": [{"hostPath": "/lib/x", "containerPath": "/lib/x"}]}
    devices.append({"name": "lib", "containerEdits": with_files})
    spec = {"cdiVersion": "0.5.0", "kind": KIND, "devices": devices,
            "containerEdits": {"deviceNodes": [{"path": "/dev/fakectl", "hostPath": "/dev/null"}]}}
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "example.json").write_text(json.dumps(spec))
    return tmp_path / "cdi"


def dumps(*names: str) -> tuple[bytes, bytes]:
    """config.dump and spec.dump of a container given `names` (and the kind's control node), as podman writes
    them: one linux.devices entry and one allow rule per node."""
    nodes = [(f"/dev/fakegpu{name}", *numbers(HOST_NODES[name])) for name in names]
    nodes.append(("/dev/fakectl", *numbers("/dev/null")))
    spec = {"ociVersion": "1.0.2", "process": {"args": ["sh"]},
            "linux": {"devices": [{"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 438,
                                   "uid": 0, "gid": 0} for path, major, minor in nodes],
                      "resources": {"devices": [{"allow": False, "access": "rwm"},
                                                *({"allow": True, "type": "c", "major": major, "minor": minor,
                                                   "access": "rwm"} for _, major, minor in nodes)]}}}
    config = {"id": "ab" * 32, "name": "web", "cdiDevices": [f"{KIND}={name}" for name in names],
              "runtime": "gpuckpt-runtime"}
    return json.dumps(config).encode(), json.dumps(spec).encode()


def moved(move: GpuMove, config: bytes, spec: bytes) -> tuple[dict, dict]:
    rewrites = move.rewrites(lambda data: data)
    return json.loads(rewrites[CONFIG_DUMP](config)), json.loads(rewrites[SPEC_DUMP](spec))


def test_a_gpu_moves_in_devices_rules_and_cdi_names(cdi_dir: Path) -> None:
    config, spec = dumps("0")
    new_config, new_spec = moved(GpuMove([f"{KIND}=1"], [str(cdi_dir)]), config, spec)
    assert new_config["cdiDevices"] == [f"{KIND}=1"]
    assert new_config["name"] == "web"  # the rest as it was
    devices = {(d["path"], d["major"], d["minor"]) for d in new_spec["linux"]["devices"]}
    assert devices == {("/dev/fakegpu1", *numbers("/dev/zero")), ("/dev/fakectl", *numbers("/dev/null"))}
    allowed = {(r["major"], r["minor"]) for r in new_spec["linux"]["resources"]["devices"] if r["allow"]}
    assert allowed == {numbers("/dev/zero"), numbers("/dev/null")}
    assert new_spec["linux"]["devices"][0]["fileMode"] == 438  # what the node entry held besides, kept


def test_two_gpus_swap_places(cdi_dir: Path) -> None:
    config, spec = dumps("0", "1")
    new_config, new_spec = moved(GpuMove([f"{KIND}=1", f"{KIND}=0"], [str(cdi_dir)]), config, spec)
    assert new_config["cdiDevices"] == [f"{KIND}=1", f"{KIND}=0"]
    paths = [(d["path"], d["minor"]) for d in new_spec["linux"]["devices"]]
    assert paths == [("/dev/fakegpu1", numbers("/dev/zero")[1]), ("/dev/fakegpu0", numbers("/dev/null")[1]),
                     ("/dev/fakectl", numbers("/dev/null")[1])]


def test_the_summary_names_each_pair(cdi_dir: Path) -> None:
    move = GpuMove([f"{KIND}=2"], [str(cdi_dir)])
    moved(move, *dumps("0"))
    assert move.summary() == f"{KIND}=0 -> {KIND}=2"


@pytest.mark.parametrize(("targets", "names", "words"), [
    ([f"{KIND}=1", f"{KIND}=2"], ("0",), "give one device for each of the checkpoint's (example.com/gpu=0); 2 given"),
    ([f"{KIND}=7"], ("0",), "--gpu device example.com/gpu=7 is not on this node: its CDI specs"),
    ([f"{KIND}=lib"], ("0",), "also mount files or set the environment"),
    (["other.com/gpu=1"], ("0",), "no device of other.com/gpu"),
])
def test_a_move_that_cannot_be_is_refused_in_one_line(cdi_dir: Path, targets: list[str], names: tuple[str, ...],
                                                      words: str) -> None:
    config, _ = dumps(*names)
    with pytest.raises(UsageError) as refused:
        GpuMove(targets, [str(cdi_dir)]).config(config)
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("target", ["gpu=1", "nvidia.com/gpu", "nvidia.com/gpu=1 --privileged", "-x", "a/b=c"])
def test_a_name_not_of_cdis_form_is_refused_before_anything(target: str) -> None:
    with pytest.raises(UsageError, match="give a CDI device name, KIND=NAME"):
        RestoreOptions(gpus=(target,)).check()


def test_the_same_device_twice_is_refused() -> None:
    with pytest.raises(UsageError, match="each device may be given once"):
        GpuMove([f"{KIND}=1", f"{KIND}=1"])


def test_spec_dump_before_config_dump_is_refused(cdi_dir: Path) -> None:
    _, spec = dumps("0")
    with pytest.raises(ImageError, match="comes before config.dump"):
        GpuMove([f"{KIND}=1"], [str(cdi_dir)]).spec(spec)


def test_a_spec_without_the_checkpoints_node_is_refused(cdi_dir: Path) -> None:
    config, spec = dumps("0")
    other = json.loads(spec)
    other["linux"]["devices"] = [d for d in other["linux"]["devices"] if d["path"] != "/dev/fakegpu0"]
    move = GpuMove([f"{KIND}=1"], [str(cdi_dir)])
    move.config(config)
    with pytest.raises(ImageError, match="lists no /dev/fakegpu0, which example.com/gpu=0 brings on this node"):
        move.spec(json.dumps(other).encode())


def test_gpu_is_not_one_of_podmans_flags() -> None:
    assert RestoreOptions(name="web2", gpus=(f"{KIND}=1",)).flags() == ["--name=web2"]


def test_without_gpu_only_the_runtime_is_rewritten() -> None:
    rewrites, move = RestoreOptions().rewrites("gpuckpt-runtime")
    assert move is None and set(rewrites) == {CONFIG_DUMP}
    config, _ = dumps("0")
    assert json.loads(rewrites[CONFIG_DUMP](config))["cdiDevices"] == [f"{KIND}=0"]
