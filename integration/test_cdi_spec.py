"""The GPU test bed's CDI spec (integration/gpu/cdi.py) on a CPU machine: generated from a fake driver tree (files
named as driver 550.54.15 names them, device nodes with /dev/null's numbers), read by the real podman with
`--device KIND=0`, its hooks run by the runtime in the container's root; and the harness's CDI mode giving the
engines `--device nvidia.com/gpu=N` and the self-contained image instead of device nodes and host binds."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bed import COUNTER_SOURCE, PODMAN_IMAGE, assert_continues, sh, wait_counter

GPU_DIR = Path(__file__).resolve().parent / "gpu"
sys.path.insert(0, str(GPU_DIR))
import cdi  # noqa: E402  (the test bed's, by path: integration/gpu is not part of the package)
import harness  # noqa: E402

VERSION = "550.54.15"
LIBRARIES = ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libcudadebugger")


def fake_driver(root: Path) -> None:
    """A node's driver as nvidia-ctk would find it: versioned libraries with their SONAME links, nvidia-smi, GSP
    firmware, the persistenced socket, the module's version, device nodes (char 1:3, harmless as /dev/null)."""
    lib = root / "usr/local/nvidia/lib64"
    lib.mkdir(parents=True)
    for name in LIBRARIES:
        (lib / f"{name}.so.{VERSION}").write_text(f"fake {name} {VERSION}\n")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.{VERSION}")
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\necho fake nvidia-smi\n")
    (root / "usr/bin/nvidia-smi").chmod(0o755)
    firmware = root / f"lib/firmware/nvidia/{VERSION}"
    firmware.mkdir(parents=True)
    (firmware / "gsp_ga10x.bin").write_text("firmware")
    (root / "sys/module/nvidia").mkdir(parents=True)
    (root / "sys/module/nvidia/version").write_text(VERSION + "\n")
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "run/nvidia-persistenced/socket"))
    listener.close()
    (root / "dev").mkdir()
    for node in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        os.mknod(root / "dev" / node, 0o666 | 0o020000, os.stat("/dev/null").st_rdev)


def state_of(name: str) -> Callable[[], str]:
    """What reads the counter's state in container `name`."""
    return lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    fake_driver(root)
    return root


def test_spec_has_nvidia_ctk_shape(driver_root: Path) -> None:
    files = cdi.discover(driver_root)
    spec = cdi.build_spec(files, "/usr/local/bin/gpuckpt-cdi-hook")
    assert (spec["cdiVersion"], spec["kind"]) == ("0.5.0", "nvidia.com/gpu")
    devices = {device["name"]: device["containerEdits"]["deviceNodes"] for device in spec["devices"]}
    assert devices["0"] == [{"path": "/dev/nvidia0", "hostPath": str(driver_root / "dev/nvidia0")}]
    assert [node["path"] for node in devices["all"]] == ["/dev/nvidia0", "/dev/nvidia1"]
    edits = spec["containerEdits"]
    assert [node["path"] for node in edits["deviceNodes"]] == ["/dev/nvidia-uvm-tools", "/dev/nvidia-uvm",
                                                              "/dev/nvidiactl"]
    mounts = {mount["containerPath"]: mount for mount in edits["mounts"]}
    libraries = {f"/usr/local/nvidia/lib64/{name}.so.{VERSION}" for name in LIBRARIES}
    assert libraries | {"/usr/bin/nvidia-smi", f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
                        "/run/nvidia-persistenced/socket"} == set(mounts)
    assert all(mounts[path]["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"] for path in libraries)
    assert mounts["/run/nvidia-persistenced/socket"]["options"] == ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
    assert mounts[f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}"]["hostPath"] == str(
        driver_root / f"usr/local/nvidia/lib64/libcuda.so.{VERSION}")
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]
    symlinks, ldcache = edits["hooks"]
    assert symlinks["hookName"] == ldcache["hookName"] == "createContainer"
    links = symlinks["args"][3::2]
    assert symlinks["args"][:2] == ["gpuckpt-cdi-hook", "create-symlinks"]
    assert f"libcuda.so.{VERSION}::/usr/local/nvidia/lib64/libcuda.so.1" in links
    assert "libcuda.so.1::/usr/local/nvidia/lib64/libcuda.so" in links
    assert f"libnvidia-ml.so.{VERSION}::/usr/local/nvidia/lib64/libnvidia-ml.so.1" in links
    assert ldcache["args"] == ["gpuckpt-cdi-hook", "update-ldcache", "--folder", "/usr/local/nvidia/lib64"]


def test_version_from_proc_and_refusals(tmp_path: Path) -> None:
    proc = tmp_path / "proc/driver/nvidia"
    proc.mkdir(parents=True)
    (proc / "version").write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release "
                                  "Build  (dvs-builder@U16-I3-B08-1-1)  Tue Sep 30 2025\nGCC version:  gcc 12\n")
    assert cdi.driver_version(tmp_path) == "580.159.04"
    with pytest.raises(RuntimeError, match="no GPU device nodes"):
        cdi.discover(tmp_path)
    with pytest.raises(RuntimeError, match="no NVIDIA driver version"):
        cdi.driver_version(tmp_path / "elsewhere")


def test_apply_to_a_bundle_config(driver_root: Path) -> None:
    spec = cdi.build_spec(cdi.discover(driver_root), "/hook")
    config = cdi.apply(spec, ["1"], {"process": {"env": ["PATH=/bin"]}, "linux": {}})
    null = os.stat("/dev/null").st_rdev
    assert [(d["path"], d["major"], d["minor"]) for d in config["linux"]["devices"]] == [
        (path, os.major(null), os.minor(null)) for path in ("/dev/nvidia-uvm-tools", "/dev/nvidia-uvm",
                                                            "/dev/nvidiactl", "/dev/nvidia1")]
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["process"]["env"]
    assert [hook["args"][1] for hook in config["hooks"]["createContainer"]] == ["create-symlinks", "update-ldcache"]
    with pytest.raises(ValueError, match="nvidia.com/gpu=7 is not in the spec"):
        cdi.apply(spec, ["7"], {})


@pytest.fixture
def spec_file(driver_root: Path, tmp_path: Path) -> Iterator[tuple[str, dict]]:
    """The fake node's spec where podman reads specs, under a kind of this test's own. The GPU nodes' container
    paths are renamed: this node's gpuckpt-hook refuses a container given /dev/nvidiaN without a driver loaded."""
    kind = f"gpuckpt-cdi-{os.getpid()}.example.com/gpu"
    hook = cdi.write_hook_launcher(tmp_path / "gpuckpt-cdi-hook", sys.executable)
    spec = cdi.build_spec(cdi.discover(driver_root), str(hook))
    spec["kind"] = kind
    for edits in [spec["containerEdits"], *(device["containerEdits"] for device in spec["devices"])]:
        for node in edits.get("deviceNodes", []):
            node["path"] = node["path"].replace("/dev/nvidia", "/dev/fake-nvidia")
    path = cdi.write_spec(spec, Path(f"/var/run/cdi/gpuckpt-cdi-test-{os.getpid()}.yaml"))
    try:
        yield kind, spec
    finally:
        path.unlink()


def test_podman_reads_the_spec(spec_file: tuple[str, dict]) -> None:
    kind, _ = spec_file
    name = f"gpuckpt-cdi-{os.getpid()}"
    script = ("import os; lib = '/usr/local/nvidia/lib64'; "
              "print(sorted(n for n in os.listdir('/dev') if n.startswith('fake-nvidia'))); "
              "print(os.readlink(lib + '/libcuda.so.1'), os.readlink(lib + '/libcuda.so')); "
              "print(open(lib + '/libcuda.so.1').read().strip()); print(os.environ['NVIDIA_VISIBLE_DEVICES']); "
              "print(open('/etc/ld.so.conf.d/00-nvcr-gpuckpt.conf').read().strip()); "
              "print(os.path.exists('/run/nvidia-persistenced/socket'), "
              f"os.path.exists('/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin'), os.access('/usr/bin/nvidia-smi', 1))")
    try:
        ran = sh("podman", "run", "--name", name, "--network", "none", "--device", f"{kind}=0", PODMAN_IMAGE,
                 "python3", "-c", script)
    finally:
        sh("podman", "rm", "-f", name, check=False)
    assert ran.stdout.splitlines() == [
        "['fake-nvidia-uvm', 'fake-nvidia-uvm-tools', 'fake-nvidia0', 'fake-nvidiactl']",
        f"libcuda.so.{VERSION} libcuda.so.1", f"fake libcuda {VERSION}", "void", "/usr/local/nvidia/lib64",
        "True True True"], ran.stdout


def test_podman_refuses_an_unknown_device(spec_file: tuple[str, dict]) -> None:
    kind, _ = spec_file
    refused = sh("podman", "run", "--rm", "--network", "none", "--device", f"{kind}=9", PODMAN_IMAGE, "true",
                 check=False)
    assert refused.returncode != 0 and f"{kind}=9" in refused.stderr, refused.stderr


def test_harness_cdi_mode_run_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "INJECT", "cdi")
    args = harness.gpu_run_args(["python3", "/work/driver_counter.py"], {"GIB": "1"}, Path("/tmp/state"),
                                "localhost/gpuckpt-gpu-cdi:latest", gpu_minors=[0, 1])
    image_at = args.index("localhost/gpuckpt-gpu-cdi:latest")
    assert args[image_at + 1:] == ["python3", "/work/driver_counter.py"]
    devices = [args[i + 1] for i, arg in enumerate(args) if arg == "--device"]
    assert devices == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    mounts = [args[i + 1] for i, arg in enumerate(args) if arg == "--mount"]
    assert [m.split("target=")[1].split(",")[0] for m in mounts] == ["/work", "/state"]
    assert not any("LD_LIBRARY_PATH" in arg or "/dev/nvidia" in arg for arg in args)


def test_podman_checkpoints_a_cdi_container(spec_file: tuple[str, dict], tmp_path: Path) -> None:
    """A container started with the CDI device, checkpointed and restored, exported with --leave-running and
    imported through gpuckpt: the same workload goes on, and the restored container still has the spec's driver
    files (bind mounts made again) and the hook's links (in its own layer: no hook runs at a restore)."""
    kind, _ = spec_file
    name = f"gpuckpt-cdi-ckpt-{os.getpid()}"
    archive = tmp_path / f"{name}.tar.zst"

    read_state = state_of(name)

    def driver_view() -> list[str]:
        return sh("podman", "exec", name, "python3", "-c", "import os; lib = '/usr/local/nvidia/lib64'; "
                  "print(os.readlink(lib + '/libcuda.so.1')); print(open(lib + '/libcuda.so.1').read().strip())"
                  ).stdout.splitlines()

    try:
        sh("podman", "run", "-d", "--name", name, "--network", "none", "--device", f"{kind}=0", PODMAN_IMAGE,
           "python3", "-c", COUNTER_SOURCE)
        before = wait_counter(read_state, 3)
        sh("podman", "container", "checkpoint", name)
        sh("podman", "container", "restore", name)
        before = assert_continues(before, read_state)
        assert driver_view() == [f"libcuda.so.{VERSION}", f"fake libcuda {VERSION}"]
        sh("gpuckpt", "export", "--leave-running", name, "-o", str(archive))
        at_export = before
        assert_continues(before, read_state)
        sh("podman", "rm", "-f", name)
        sh("gpuckpt", "import", "--trust-config", str(archive))
        assert_continues(at_export, read_state)
        assert driver_view() == [f"libcuda.so.{VERSION}", f"fake libcuda {VERSION}"]
    finally:
        sh("podman", "rm", "-f", name, check=False)


def test_an_import_moves_the_container_onto_another_cdi_device(spec_file: tuple[str, dict], tmp_path: Path) -> None:
    """`gpuckpt import --gpu KIND=1` of a container started with KIND=0: podman makes the restored container from
    the staged spec.dump, which now gives it device 1's node (the runtime's config.json says so) and the workload
    goes on; a device this node's specs lack is refused in one line before anything is staged."""
    kind, _ = spec_file
    name = f"gpuckpt-cdi-move-{os.getpid()}"
    archive = tmp_path / f"{name}.tar.zst"

    read_state = state_of(name)

    def runtime_devices() -> list[str]:
        config = json.loads(Path(sh("podman", "inspect", "--format", "{{.OCIConfigPath}}", name).stdout.strip())
                            .read_text())
        return sorted(d["path"] for d in config["linux"]["devices"] if d["path"].startswith("/dev/fake-nvidia"))

    try:
        sh("podman", "run", "-d", "--name", name, "--network", "none", "--device", f"{kind}=0", PODMAN_IMAGE,
           "python3", "-c", COUNTER_SOURCE)
        before = wait_counter(read_state, 3)
        assert "/dev/fake-nvidia0" in runtime_devices()
        sh("gpuckpt", "export", name, "-o", str(archive))
        sh("podman", "rm", "-f", name)
        refused = sh("gpuckpt", "import", "--trust-config", "--gpu", f"{kind}=7", str(archive), check=False)
        assert refused.returncode == 2 and f"{kind}=7 is not on this node" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert sh("podman", "container", "exists", name, check=False).returncode == 1  # nothing made
        imported = sh("gpuckpt", "import", "--trust-config", "--gpu", f"{kind}=1", str(archive))
        assert f"onto {kind}=0 -> {kind}=1" in imported.stdout + imported.stderr
        assert_continues(before, read_state)
        assert runtime_devices() == ["/dev/fake-nvidia-uvm", "/dev/fake-nvidia-uvm-tools", "/dev/fake-nvidia1",
                                     "/dev/fake-nvidiactl"]
        # and back onto device 0 from the store
        before = wait_counter(read_state, 1)
        store = tmp_path / "store"
        sh("gpuckpt", "store", "checkpoint", "--store", str(store), "--name", "moved", name)
        sh("podman", "rm", "-f", name)
        sh("gpuckpt", "store", "restore", "--store", str(store), "--trust-config", "--gpu", f"{kind}=0", "moved")
        assert_continues(before, read_state)
        assert "/dev/fake-nvidia0" in runtime_devices() and "/dev/fake-nvidia1" not in runtime_devices()
    finally:
        sh("podman", "rm", "-f", name, check=False)


def test_harness_cdi_bundle(spec_file: tuple[str, dict], rootfs: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's runc bundle in CDI mode (what the bundle scenarios run in): an overlay of the image's root,
    the spec's edits applied as a CDI-aware engine applies them; run, checkpointed (the dump ends it) and restored
    by gpuckpt-runtime, the workload goes on with the hook's links in place."""
    _, fake_spec = spec_file
    monkeypatch.setattr(harness, "INJECT", "cdi")
    monkeypatch.setattr(harness, "IMAGE_ROOT", rootfs)
    monkeypatch.setattr(harness, "WORK", tmp_path / "work")
    monkeypatch.setattr(harness, "RUNTIME", shutil.which("gpuckpt-runtime"))
    monkeypatch.setattr(harness, "cdi_spec", lambda: fake_spec)
    bundle = harness.Bundle("cdi-cpu", ["python3", "-c", COUNTER_SOURCE.replace("/tmp/state", "/tmp/cdi-state")], {})
    try:
        config = json.loads((bundle.dir / "config.json").read_text())
        assert not any(mount["destination"] in ("/usr", "/opt/torch", "/etc") for mount in config["mounts"])
        bundle.start()
        before = wait_counter(lambda: bundle.read("cdi-state"), 3)
        bundle.checkpoint(tmp_path / "images")
        bundle.restore(tmp_path / "images")
        assert_continues(before, lambda: bundle.read("cdi-state"))
        assert os.readlink(bundle.rootfs / "usr/local/nvidia/lib64/libcuda.so.1") == f"libcuda.so.{VERSION}"
    finally:
        bundle.destroy()

