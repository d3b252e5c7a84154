"""`gpuckpt doctor`'s GPU/CDI check (issue 32, item 5): the CDI specs in a directory (real files, in nvidia-ctk's
YAML and JSON shapes and as the GPU test bed writes them), the devices they name, whether their driver files are
the loaded driver's; skipped on a node without an NVIDIA driver."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gpuckpt.cli import doctor
from gpuckpt.cuda.devices import loaded_module_version
from gpuckpt.oci.cdi import read_block_yaml, read_spec_file

VERSION, OTHER = "550.54.15", "560.35.05"
GPU_UUID = "GPU-11111111-2222-3333-4444-555555555555"


def driver_files(root: Path, version: str) -> Path:
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True, exist_ok=True)
    for name in ("libcuda.so", "libnvidia-ml.so"):
        (lib / f"{name}.{version}").write_text(f"fake {name} {version}\n")
    return lib


def nvidia_ctk_yaml(lib: Path, version: str) -> str:
    """What `nvidia-ctk cdi generate` writes (go-yaml's block style; docs/cdi.md names the source of each part)."""
    return f"""---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  hooks:
  - args:
    - nvidia-cdi-hook
    - create-symlinks
    - --link
    - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so
    hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
  mounts:
  - containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{version}
    hostPath: {lib}/libcuda.so.{version}
    options:
    - ro
    - nosuid
    - nodev
    - rbind
    - rprivate
  - containerPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}
    hostPath: '{lib}/libnvidia-ml.so.{version}'
    options:
    - ro
    - nosuid
    - nodev
    - rbind
    - rprivate
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: {GPU_UUID}
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: all
kind: nvidia.com/gpu
"""


def test_a_gpu_less_node_skips_the_check(tmp_path: Path) -> None:
    """A skip, not an `ok` line saying "skipped" (the operator trial of issue 33 saw one)."""
    with pytest.raises(doctor.CheckSkipped, match="^GPU/CDI: skipped: no NVIDIA driver loaded"):
        doctor.cdi_report([str(tmp_path)], None)


def test_this_node_without_a_driver_skips_it_wherever_the_specs_are(tmp_path: Path, monkeypatch) -> None:
    if loaded_module_version() is not None:
        pytest.skip("this node has an NVIDIA driver loaded")
    monkeypatch.setenv(doctor.CDI_DIRS_ENV, str(tmp_path))
    with pytest.raises(doctor.CheckSkipped, match="^GPU/CDI: skipped"):
        doctor.check_cdi()


def test_no_spec_is_a_warning_with_the_command_that_writes_one(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a spec")
    with pytest.raises(doctor.CheckWarned) as warned:
        doctor.cdi_report([str(tmp_path), str(tmp_path / "absent")], VERSION)
    assert f"no CDI spec (*.json, *.yaml) in {tmp_path}, {tmp_path}/absent" in str(warned.value)
    assert warned.value.fix.startswith("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")


def test_a_spec_of_the_loaded_driver_names_the_devices_the_engines_hand_out(tmp_path: Path) -> None:
    spec = tmp_path / "cdi" / "nvidia.yaml"
    spec.parent.mkdir()
    spec.write_text(nvidia_ctk_yaml(driver_files(tmp_path / "host", VERSION), VERSION))
    line = doctor.cdi_report([str(spec.parent)], VERSION)
    assert line == (f"GPU/CDI: {spec}: nvidia.com/gpu=0, nvidia.com/gpu={GPU_UUID}, nvidia.com/gpu=all; "
                    f"driver files of {VERSION} (the loaded driver)")


def test_a_spec_of_another_driver_fails_naming_both_versions(tmp_path: Path) -> None:
    lib = driver_files(tmp_path / "host", OTHER)
    spec = tmp_path / "cdi" / "nvidia.json"
    spec.parent.mkdir()
    spec.write_text(json.dumps(read_block_yaml(nvidia_ctk_yaml(lib, OTHER))))  # the same spec, as JSON
    with pytest.raises(doctor.CheckFailed) as failed:
        doctor.cdi_report([str(spec.parent)], VERSION)
    assert f"{spec} mounts driver {OTHER} ({lib}/libcuda.so.{OTHER}), the loaded driver is {VERSION}" in str(
        failed.value)
    assert "again after each driver install or upgrade" in failed.value.fix


def test_a_spec_whose_host_files_are_gone_fails(tmp_path: Path) -> None:
    lib = driver_files(tmp_path / "host", VERSION)
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text(nvidia_ctk_yaml(lib, VERSION))
    (lib / f"libnvidia-ml.so.{VERSION}").unlink()
    with pytest.raises(doctor.CheckFailed, match=r"mounts 1 host file\(s\) this node lacks \(.*libnvidia-ml"):
        doctor.cdi_report([str(tmp_path / "cdi")], VERSION)


def test_yaml_the_reader_does_not_take_is_named_by_line(tmp_path: Path) -> None:
    (tmp_path / "odd.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: &anchor\n")
    with pytest.raises(doctor.CheckFailed) as failed:
        doctor.cdi_report([str(tmp_path)], VERSION)
    assert "odd.yaml: line 3: YAML this reader does not take ('&anchor'); write the spec as JSON" in str(failed.value)


def test_the_reader_reads_the_shape_the_gpu_test_bed_writes(tmp_path: Path, monkeypatch) -> None:
    """integration/gpu/cdi.py's spec from a fake driver tree, read back as it wrote it."""
    source = Path(__file__).resolve().parent.parent / "integration" / "gpu" / "cdi.py"
    loaded = importlib.util.spec_from_file_location("gpu_bed_cdi", source)
    assert loaded is not None and loaded.loader is not None
    bed = importlib.util.module_from_spec(loaded)
    monkeypatch.setitem(sys.modules, "gpu_bed_cdi", bed)  # its dataclasses look their module up there
    loaded.loader.exec_module(bed)
    root = tmp_path / "node"
    lib = driver_files(root, VERSION)
    (root / "sys/module/nvidia").mkdir(parents=True)
    (root / "sys/module/nvidia/version").write_text(VERSION + "\n")
    (root / "dev").mkdir()
    (root / "dev/nvidia0").write_text("")
    built = bed.build_spec(bed.discover(root, uuids={"0": GPU_UUID}), "/usr/local/bin/gpuckpt-cdi-hook")
    written = bed.write_spec(built, tmp_path / "cdi" / "gpuckpt-bed.yaml")
    as_json = tmp_path / "cdi" / "gpuckpt-bed.json"
    as_json.write_text(json.dumps(built))
    assert read_block_yaml(written.read_text()) == built  # every value, not only the parts gpuckpt reads
    assert read_spec_file(str(written)) == read_spec_file(str(as_json))
    assert loaded_module_version(str(root)) == VERSION
    assert read_spec_file(str(written)).driver_versions() == {VERSION: f"{lib}/libcuda.so.{VERSION}"}


def test_the_loaded_module_version_comes_from_proc_where_sysfs_has_none(tmp_path: Path) -> None:
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {VERSION}  Release Build  (dvs-builder@U16)\n"
        "GCC version:  gcc version 12.2.0\n")
    assert loaded_module_version(str(tmp_path)) == VERSION
    assert loaded_module_version(str(tmp_path / "none")) is None
