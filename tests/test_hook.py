"""gpuckpt-hook as an engine runs it (a process, the OCI state on stdin), and the runtime's
`create` that adds it for engines without hooks.d. The GPUs are a /proc/driver/nvidia tree made
here (GPUCKPT_NVIDIA_PROC); integration/test_hook.py runs it under podman and docker."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support import write_config

from gpuckpt.hooks.main import RECORD_VERSION, engine_of
from gpuckpt.node.container_record import RECORD_VERSION as MODEL_VERSION
from gpuckpt.node.container_record import ContainerRecord, parse_record
from gpuckpt.node.hook_entry import HOOK_TIMEOUT_S, STAGES
from gpuckpt.node.hooks_d import PACKAGED_HOOK_PATH, HooksDFile, SpecHook, hooks_d_files

REPO = Path(__file__).resolve().parent.parent
UUID0 = "GPU-12345678-1234-1234-1234-123456789abc"
UUID1 = "GPU-87654321-4321-4321-4321-cba987654321"


@pytest.fixture
def gpus(node: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node with GPUs at minors 0 and 1, as the driver lists them."""
    proc = node / "nvidia"
    for bus, minor, uuid in (("0000:01:00.0", 0, UUID0), ("0000:02:00.0", 1, UUID1)):
        (proc / "gpus" / bus).mkdir(parents=True)
        (proc / "gpus" / bus / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\n"
            f"Bus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n")
    monkeypatch.setenv("GPUCKPT_NVIDIA_PROC", str(proc))
    return proc


def bundle(tmp_path: Path, devices: list[str] = (), env: list[str] = (), name: str = "bundle") -> Path:
    path = tmp_path / name
    path.mkdir()
    spec = {"ociVersion": "1.2.0", "process": {"args": ["sleep", "1"], "env": ["PATH=/bin", *env]},
            "root": {"path": "rootfs"},
            "linux": {"devices": [{"path": device, "type": "c", "major": 195, "minor": 0} for device in devices]}}
    (path / "config.json").write_text(json.dumps(spec))
    return path


def state(container_id: str, bundle_path: Path | str, annotations: dict[str, str] | None = None) -> bytes:
    return json.dumps({"ociVersion": "1.2.0", "id": container_id, "status": "creating", "pid": 4242,
                       "bundle": str(bundle_path), "annotations": annotations or {}}).encode()


def hook(stage: str, stdin: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuckpt.hooks.main", stage], input=stdin,
                          capture_output=True, timeout=30)


def records(node: Path) -> dict[str, ContainerRecord]:
    directory = node / "state" / "containers"
    return {path.stem: parse_record(path.read_bytes(), str(path)) for path in directory.glob("*.json")}


def test_gpu_container_recorded_at_create_and_forgotten_at_poststop(node, gpus, tmp_path) -> None:
    spec_dir = bundle(tmp_path, ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"])
    created = hook("createRuntime", state("job-1", spec_dir, {"io.container.manager": "libpod"}))
    assert created.returncode == 0, created.stderr
    record = records(node)["job-1"]
    assert (record.engine, record.bundle, record.pid) == ("podman", str(spec_dir), 4242)
    assert [(gpu.minor, gpu.uuid) for gpu in record.gpus] == [(1, UUID1)]
    assert stat.S_IMODE((node / "state" / "containers").stat().st_mode) == 0o700
    assert stat.S_IMODE((node / "state" / "containers" / "job-1.json").stat().st_mode) == 0o600
    assert hook("poststop", state("job-1", spec_dir)).returncode == 0
    assert records(node) == {}


def test_records_are_the_models_format(node, gpus, tmp_path) -> None:
    """What the hook writes (json, for its start-up) is exactly what the model reads: no field more or less."""
    assert RECORD_VERSION == MODEL_VERSION
    hook("createRuntime", state("a", bundle(tmp_path, ["/dev/nvidia0"])))
    hook("createRuntime", state("b", bundle(tmp_path, env=["NVIDIA_VISIBLE_DEVICES=all"], name="b")))
    written = {path.stem: json.loads(path.read_text()) for path in (node / "state" / "containers").glob("*.json")}
    assert set(written) == {"a", "b"}
    for raw in written.values():
        assert set(raw) == set(ContainerRecord.model_fields)
    assert records(node)["b"].visible_devices == "all" and records(node)["b"].gpus == []


def test_container_without_gpu_leaves_no_record(node, gpus, tmp_path) -> None:
    for env in ([], ["NVIDIA_VISIBLE_DEVICES=void"], ["NVIDIA_VISIBLE_DEVICES="]):
        spec_dir = bundle(tmp_path, ["/dev/fuse"], env, name=f"b{len(env) and env[0][-2:]}")
        assert hook("createRuntime", state("cpu", spec_dir)).returncode == 0
    assert not (node / "state" / "containers").exists() or records(node) == {}


def test_gpu_missing_on_this_node_is_refused_with_one_line(node, gpus, tmp_path) -> None:
    result = hook("createRuntime", state("moved", bundle(tmp_path, ["/dev/nvidia0", "/dev/nvidia3"])))
    assert result.returncode == 1
    assert result.stderr.decode() == ("gpuckpt-hook: container moved is given /dev/nvidia3 but this node has no "
                                      "such GPU (GPUs here: /dev/nvidia0, /dev/nvidia1)\n")
    assert records(node) == {}


def test_gpu_container_on_a_node_without_driver_is_refused(node, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPUCKPT_NVIDIA_PROC", str(tmp_path / "absent"))
    result = hook("createRuntime", state("c", bundle(tmp_path, ["/dev/nvidia0"])))
    assert result.returncode == 1
    assert b"this node has no NVIDIA GPU" in result.stderr and result.stderr.count(b"\n") == 1


@pytest.mark.parametrize(("bundle_path", "annotations", "engine"), [
    ("/run/containerd/io.containerd.runtime.v2.task/moby/abc", {}, "docker"),
    ("/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc", {}, "containerd"),
    ("/var/lib/containers/storage/overlay-containers/abc/userdata",
     {"io.container.manager": "libpod", "io.kubernetes.cri-o.Created": "x"}, "podman"),
    ("/run/containers/storage/overlay-containers/abc/userdata", {"io.kubernetes.cri-o.ContainerType": "container"},
     "cri-o"),
    ("/srv/bundles/abc", {}, "runc"),
    # podman's bundle layout decides, not the annotation a user's --annotation overrides
    ("/var/lib/containers/storage/overlay-containers/abc/userdata", {"io.container.manager": "evil"}, "podman"),
    ("/var/lib/containers/storage/vfs-containers/abc/userdata", {}, "podman"),
    # A user's annotation cannot move a container out of the engine whose bundle it is.
    ("/run/containerd/io.containerd.runtime.v2.task/moby/abc", {"io.container.manager": "libpod"}, "docker"),
])
def test_engine_from_bundle_then_annotations(bundle_path, annotations, engine) -> None:
    assert engine_of(bundle_path, annotations) == engine


@pytest.mark.hostile("a container id with a path in it, in the state an engine passes to gpuckpt-hook")
@pytest.mark.parametrize("container_id", ["../../etc/cron.d/x", ".hidden", "a/b", "", "x" * 201, 7])
def test_container_id_outside_the_allow_list_is_refused(node, gpus, tmp_path, container_id) -> None:
    result = hook("createRuntime", state(container_id, bundle(tmp_path, ["/dev/nvidia0"])))
    assert result.returncode == 1 and b"not allowed" in result.stderr
    assert not (tmp_path / "etc").exists() and records(node) == {}


@pytest.mark.hostile("a container's config.json replaced by a link or a FIFO when gpuckpt-hook reads it")
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_spec_that_is_not_a_regular_file_is_refused(node, gpus, tmp_path, kind) -> None:
    spec_dir = bundle(tmp_path, ["/dev/nvidia0"])
    (spec_dir / "config.json").unlink()
    if kind == "symlink":
        (spec_dir / "config.json").symlink_to(bundle(tmp_path, ["/dev/nvidia0"], name="real") / "config.json")
    else:
        os.mkfifo(spec_dir / "config.json")
    result = hook("createRuntime", state("c", spec_dir))  # a FIFO would hang a reader that opened it blocking
    assert result.returncode == 1, result.stderr
    assert b"config.json" in result.stderr and records(node) == {}


@pytest.mark.hostile("an inventory directory another user can write (planted records, swapped names)")
def test_inventory_writable_by_others_is_refused(node, gpus, tmp_path) -> None:
    (node / "state" / "containers").mkdir(parents=True)
    os.chmod(node / "state" / "containers", 0o777)
    result = hook("createRuntime", state("c", bundle(tmp_path, ["/dev/nvidia0"])))
    assert result.returncode == 1 and b"refusing to use it" in result.stderr


@pytest.mark.hostile("an inventory directory replaced by a link to another directory")
def test_inventory_through_a_link_is_refused(node, gpus, tmp_path) -> None:
    (node / "state").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (node / "state" / "containers").symlink_to(tmp_path / "elsewhere")
    result = hook("createRuntime", state("c", bundle(tmp_path, ["/dev/nvidia0"])))
    assert result.returncode == 1
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("stdin", [b"not json", b"[]", b"{" + b" " * (1 << 20) + b"}",
                                   json.dumps({"id": "c", "bundle": "relative/dir"}).encode()])
def test_bad_state_is_one_line(node, gpus, stdin) -> None:
    result = hook("createRuntime", stdin)
    assert result.returncode == 1 and result.stderr.startswith(b"gpuckpt-hook: ") and result.stderr.count(b"\n") == 1


def test_unknown_stage_names_the_allowed_ones() -> None:
    result = hook("prestart", b"{}")
    assert result.returncode == 2 and b"createRuntime|poststop" in result.stderr


def test_shipped_hooks_d_files_are_the_models() -> None:
    """hooks/oci-hooks.d (what the packages install) is what node/hooks_d.py writes for the packaged path."""
    shipped = {path.name: path.read_text() for path in (REPO / "hooks" / "oci-hooks.d").glob("*.json")}
    assert shipped == hooks_d_files(PACKAGED_HOOK_PATH)
    assert sorted(stage for text in shipped.values() for stage in HooksDFile.model_validate_json(text).stages) == \
        sorted(STAGES)


# The runtime's create, as docker's containerd shim calls it.

@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """gpuckpt-runtime and gpuckpt-hook side by side, as an installation puts them."""
    bin_dir = tmp_path / "installed"
    bin_dir.mkdir()
    for name, module in (("gpuckpt-runtime", "gpuckpt.shim.main"), ("gpuckpt-hook", "gpuckpt.hooks.main")):
        launcher = bin_dir / name
        launcher.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import main\nsys.exit(main())\n")
        launcher.chmod(0o755)
    return bin_dir


def create(installed: Path, spec_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([installed / "gpuckpt-runtime", "--root", "/r", "create", "--bundle", spec_dir,
                           "--pid-file", "/p", "c1"], capture_output=True, text=True, timeout=30)


def test_create_adds_the_hook_to_a_gpu_containers_spec_once(node, recording_runtime, installed, tmp_path) -> None:
    write_config(node, f'delegate = "{recording_runtime}"\n[hook]\nadd_to_spec = true\n')
    spec_dir = bundle(tmp_path, ["/dev/nvidia0"])
    for _ in range(2):
        result = create(installed, spec_dir)
        assert result.returncode == 0, result.stderr
    hooks = json.loads((spec_dir / "config.json").read_text())["hooks"]
    assert {stage: [SpecHook.model_validate(entry) for entry in hooks[stage]] for stage in hooks} == {
        stage: [SpecHook(path=str(installed / "gpuckpt-hook"), args=["gpuckpt-hook", stage], timeout=HOOK_TIMEOUT_S)]
        for stage in STAGES}
    assert (recording_runtime.parent / "argv").read_text().splitlines() == [
        "--root", "/r", "create", "--bundle", str(spec_dir), "--pid-file", "/p", "c1"]


def test_create_leaves_other_specs_and_the_default_alone(node, recording_runtime, installed, tmp_path) -> None:
    cpu = bundle(tmp_path, [], name="cpu")
    before = (cpu / "config.json").read_bytes()
    write_config(node, f'delegate = "{recording_runtime}"\n[hook]\nadd_to_spec = true\n')
    assert create(installed, cpu).returncode == 0
    gpu = bundle(tmp_path, ["/dev/nvidia0"], name="gpu")
    gpu_before = (gpu / "config.json").read_bytes()
    write_config(node, f'delegate = "{recording_runtime}"\n')
    assert create(installed, gpu).returncode == 0
    assert (cpu / "config.json").read_bytes() == before and (gpu / "config.json").read_bytes() == gpu_before


def test_create_without_the_hook_installed_fails_before_the_delegate(node, recording_runtime, installed,
                                                                     tmp_path) -> None:
    (installed / "gpuckpt-hook").unlink()
    write_config(node, f'delegate = "{recording_runtime}"\n[hook]\nadd_to_spec = true\n')
    result = create(installed, bundle(tmp_path, ["/dev/nvidia0"]))
    assert result.returncode == 1
    assert "hook.add_to_spec is on" in result.stderr and "gpuckpt-hook is not an executable" in result.stderr
    assert not (recording_runtime.parent / "argv").exists()


def test_poststop_of_another_bundle_leaves_the_record(node, gpus, tmp_path) -> None:
    """Two engines may use one id: the stop of one container never takes the other's record."""
    docker_bundle = bundle(tmp_path, ["/dev/nvidia0"], name="moby-job")
    assert hook("createRuntime", state("job", docker_bundle)).returncode == 0
    assert hook("poststop", state("job", tmp_path / "k8s.io-job")).returncode == 0
    assert set(records(node)) == {"job"}
    assert hook("poststop", state("job", docker_bundle)).returncode == 0
    assert records(node) == {}


@pytest.mark.hostile("device paths that only look like /dev/nvidiaN (other digits, a newline, 5000 digits)")
@pytest.mark.parametrize("path", ["/dev/nvidia\u0663", "/dev/nvidia\uff11", "/dev/nvidia0\n",
                                  "/dev/nvidia" + "9" * 5000])
def test_only_ascii_device_minors_count(node, gpus, tmp_path, path) -> None:
    result = hook("createRuntime", state("c", bundle(tmp_path, [path])))
    assert result.returncode == 0, result.stderr
    assert not (node / "state" / "containers").exists() or records(node) == {}


def test_rootless_engines_hooks_do_nothing(node, gpus, tmp_path) -> None:
    """Rootless podman reads the system hooks.d too: as its user the hook records and refuses nothing."""
    spec_dir = bundle(tmp_path, ["/dev/nvidia7"])  # a GPU this node lacks: root would refuse it
    tmp_path.chmod(0o755)
    spec_dir.chmod(0o755)
    (spec_dir / "config.json").chmod(0o644)
    result = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
                             "-m", "gpuckpt.hooks.main", "createRuntime"], input=state("c", spec_dir),
                            capture_output=True, timeout=30)
    assert result.returncode == 0 and result.stderr == b""


def test_restore_adds_the_hook_to_the_restored_bundle(node, recording_runtime, installed, tmp_path) -> None:
    """containerd restores into a fresh bundle without `create`: the restore adds the hook there."""
    write_config(node, f'delegate = "{recording_runtime}"\n[hook]\nadd_to_spec = true\n')
    spec_dir = bundle(tmp_path, ["/dev/nvidia0"])
    subprocess.run([installed / "gpuckpt-runtime", "--root", "/r", "restore", "--image-path", tmp_path / "img",
                    "--bundle", spec_dir, "c1"], capture_output=True, text=True, timeout=60)
    hooks = json.loads((spec_dir / "config.json").read_text()).get("hooks", {})
    assert [entry["path"] for entry in hooks.get("createRuntime", [])] == [str(installed / "gpuckpt-hook")]


@pytest.mark.hostile("a record of a container's id grown past the inventory's read bound")
def test_poststop_removes_its_record_even_when_it_cannot_be_read(node, gpus, tmp_path) -> None:
    spec_dir = bundle(tmp_path, ["/dev/nvidia0"])
    assert hook("createRuntime", state("big", spec_dir)).returncode == 0
    record = node / "state" / "containers" / "big.json"
    record.write_bytes(record.read_bytes()[:-1] + b" " * (64 << 10) + b"}")
    assert hook("poststop", state("big", spec_dir)).returncode == 0
    assert not record.exists()
