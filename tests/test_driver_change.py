"""The driver changed under the checkpoint (issue 32, item 4): the checkpoint records the NVIDIA libraries its
processes map; a restore whose node runs another driver, or whose config brings other files, is refused before
the delegate runs; the same driver restores. Through the fake driver at the binding seam, with real processes
that map a file named as the driver's libcuda (tests/test_gpu_verbs.py's fake node and runtime)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_driver import FakeDriver
from test_gpu_verbs import H100, UUID0, Node, restore_args

from gpuckpt.cli.main import main
from gpuckpt.cuda import inventory
from gpuckpt.cuda.devices import GpuInfo
from gpuckpt.cuda.driver import ProcessState
from gpuckpt.cuda.node import NodeGpus
from gpuckpt.errors import GpuCheckpointError
from gpuckpt.host.processes import Process, Processes, read_processes
from gpuckpt.oci.manifest import MANIFEST_NAME, GpuRecord, read_manifest
from gpuckpt.oci.nvidia_paths import driver_file_version
from gpuckpt.oci.spec import Spec
from gpuckpt.policy.driver_files import driver_files_of
from gpuckpt.shim import restore
from gpuckpt.trust.dump_signature import sign_dump

OLD, NEW = "550.54.15", "560.35.05"
LIB_DIR = "usr/lib/x86_64-linux-gnu"
MAPPER = """
import mmap, sys, time
files = [open(path, "rb") for path in sys.argv[1:]]
held = [mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) for file in files]
print("mapped", flush=True)
time.sleep(60)
"""


def driver_tree(root: Path, version: str) -> Path:
    """A node's driver libraries of `version` under `root` (mappable files; their content is never run)."""
    lib = root / LIB_DIR
    lib.mkdir(parents=True, exist_ok=True)
    for name in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"):
        (lib / f"{name}.{version}").write_bytes(b"\x7fELF" + version.encode() * 1024)
    return lib / f"libcuda.so.{version}"


def mapping(*paths: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", MAPPER, *map(str, paths)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "mapped"
    return process


def write_bundle(node: Node, libraries: list[Path]) -> None:
    """The bundle's config.json as an engine writes it from a CDI spec: one bind mount per driver file at its host
    path (nvidia-ctk's shape, docs/cdi.md), beside the GPU's device node."""
    mounts = [{"destination": str(lib), "source": str(lib), "type": "bind",
               "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]} for lib in libraries]
    (node.bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "annotations": {}, "mounts": mounts,
        "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}}))


@pytest.fixture
def driver_node(tmp_path, monkeypatch, node):
    """A checkpointed fake container whose one process maps driver OLD's libcuda, bind-mounted from the host."""
    made = Node(tmp_path, 0, monkeypatch)
    libcuda = driver_tree(tmp_path / "host", OLD)
    made.sleeps = [mapping(libcuda)]
    made.pids = [process.pid for process in made.sleeps]
    made.driver = FakeDriver(made.pids, visible_gpus={pid: [UUID0] for pid in made.pids})
    made.gpus["describe_container_gpus"] = (lambda spec, pids: inventory.Inventory(
        driver_version=OLD, cuda_driver_version=12040,
        gpus=[GpuRecord(index=0, uuid=UUID0, name=H100, memory_total_bytes=80 << 30)], node_gpu_uuids=[UUID0],
        memory_bytes={pid: 1 << 30 for pid in pids}, process_gpus={pid: [UUID0] for pid in pids}))
    made.set_runtime()
    write_bundle(made, [libcuda])
    assert made.checkpoint() == 0
    made.gpus["container_gpus"] = (lambda spec, pids, gpus=None: [
        GpuInfo(index=0, uuid=UUID0, name=H100, memory_total_bytes=80 << 30, memory_free_bytes=79 << 30, minor=0)])
    made.gpus["list_gpus"] = lambda: made.gpus["container_gpus"](None, [])
    made.gpus["driver_version_string"] = lambda: OLD
    made.driver.initialized = False  # a new shim process
    yield made
    made.stop()


def refused(node: Node) -> str:
    before = len(node.calls())
    with pytest.raises(GpuCheckpointError) as refusal:
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert len(node.calls()) == before  # refused before the delegate (and so CRIU) ran
    assert node.driver.states[node.pids[0]] == ProcessState.CHECKPOINTED  # the container left as it was
    assert refusal.value.exit_status == 1  # runc's status for a failed restore
    assert "\n" not in str(refusal.value)
    return str(refusal.value)


def test_the_checkpoint_records_the_driver_files_its_processes_map(driver_node, tmp_path, capsys) -> None:
    manifest = read_manifest(str(driver_node.images))
    libcuda = str(tmp_path / "host" / LIB_DIR / f"libcuda.so.{OLD}")
    assert [(r.path, r.version, r.host_path) for r in manifest.driver_files] == [(libcuda, OLD, libcuda)]
    assert manifest.driver_version == OLD
    assert main(["inspect", str(driver_node.images)]) == 0
    assert f"driver files 1 mapped, of driver {OLD}: libcuda.so.{OLD}" in capsys.readouterr().out


def test_the_same_driver_restores(driver_node) -> None:
    assert restore.run(restore_args(driver_node), str(driver_node.runtime), NodeGpus(**driver_node.gpus)) == 0
    assert driver_node.all_running()


def test_a_node_running_another_driver_is_refused_naming_both_versions(driver_node, tmp_path) -> None:
    driver_node.gpus["driver_version_string"] = lambda: NEW
    line = refused(driver_node)
    assert f"its processes run NVIDIA driver {OLD} (they map {tmp_path}/host/{LIB_DIR}/libcuda.so.{OLD})" in line
    assert f"this node runs driver {NEW}" in line
    assert f"restore it on a node with driver {OLD}" in line


def test_a_spec_that_brings_another_drivers_files_is_refused(driver_node, tmp_path) -> None:
    """The other node's CDI spec mounts its own driver's files: the checkpoint's libcuda is not among them."""
    write_bundle(driver_node, [driver_tree(tmp_path / "other", NEW)])
    line = refused(driver_node)
    assert f"run NVIDIA driver {OLD}" in line
    assert f"this restore's config brings driver {NEW}'s files (the restore's config mounts nothing at " in line


def test_a_spec_naming_files_this_node_lacks_is_refused(driver_node, tmp_path) -> None:
    """An archive's old config (podman's spec.dump) names the checkpoint node's files: cuda-checkpoint#21's
    "bind mount source stat" failure, refused with the reason before runc meets it."""
    libcuda = tmp_path / "host" / LIB_DIR / f"libcuda.so.{OLD}"
    libcuda.unlink()
    line = refused(driver_node)
    assert f"is mounted from {libcuda}, which this node does not have" in line


def test_an_old_manifest_without_the_record_follows_the_version_policy(driver_node) -> None:
    """A manifest from a gpuckpt before the record: no files checked, cuda.driver_version_policy ('same-major' by
    default) judges the version, as before."""
    path = driver_node.images / MANIFEST_NAME
    written = json.loads(path.read_text())
    del written["driver_files"]
    path.write_text(json.dumps(written))
    assert sign_dump(str(driver_node.images)) is not None
    assert read_manifest(str(driver_node.images)).driver_files == []
    driver_node.gpus["driver_version_string"] = lambda: "550.100.01"  # same branch: the policy lets it through
    assert restore.run(restore_args(driver_node), str(driver_node.runtime), NodeGpus(**driver_node.gpus)) == 0
    assert driver_node.all_running()


def test_driver_files_are_told_from_the_images_own_libraries(tmp_path) -> None:
    assert driver_file_version(f"/{LIB_DIR}/libcuda.so.580.159.04") == "580.159.04"
    assert driver_file_version("/usr/lib64/libEGL_nvidia.so.560.35.03") == "560.35.03"
    assert driver_file_version("/usr/lib64/libnvidia-ml.so.580.159.04") == "580.159.04"
    for other in ("/usr/lib/libcudart.so.12.4.127", "/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so",
                  "/usr/lib/libnvrtc.so.12.4.127", "/usr/lib/libc.so.6", "/x/libcuda.so.580.159.04 (deleted)"):
        assert driver_file_version(other) is None, other
    # a CUDA forward-compatibility libcuda is the image's own: recorded without a host file
    compat = driver_tree(tmp_path / "image" / "usr/local/cuda/compat", NEW)
    mapper = mapping(compat)
    try:
        records = driver_files_of(read_processes([mapper.pid]), Spec())
    finally:
        mapper.kill()
        mapper.wait()
    assert [(r.path, r.version, r.host_path) for r in records] == [(str(compat), NEW, "")]


def test_a_file_runc_mounted_through_an_image_link_is_still_the_configs() -> None:
    """nvidia-ctk's containerPath may be /lib/x86_64-linux-gnu/...; in a merged-/usr image runc mounts it through the
    link, and the process maps it at /usr/lib/x86_64-linux-gnu/...: the same file of the same name."""
    mapped = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{OLD}"
    process = Process(pid=10, container_pid=1, fd_targets=frozenset(), file_locks=0, mappings=(mapped,),
                      deleted_files=(), children=())
    spec = Spec.model_validate({"mounts": [
        {"destination": "/proc", "source": "proc", "type": "proc"},
        {"destination": f"/lib/x86_64-linux-gnu/libcuda.so.{OLD}", "source": f"/lib/x86_64-linux-gnu/libcuda.so.{OLD}",
         "type": "bind", "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}]})
    records = driver_files_of(Processes((process,)), spec)
    assert [(r.path, r.host_path) for r in records] == [(mapped, f"/lib/x86_64-linux-gnu/libcuda.so.{OLD}")]
