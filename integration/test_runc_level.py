"""An OCI bundle checkpointed and restored through gpuckpt-runtime at runc level."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from bed import (
    COUNTER_SOURCE,
    RUNTIME,
    RUNTIME_ROOT,
    assert_continues,
    detached,
    make_bundle,
    runtime,
    sh,
    wait_counter,
)

from gpuckpt.errors import GpuCheckpointError
from gpuckpt.oci.spec import Device
from gpuckpt.shim.devnodes import sync_nvidia_nodes


@pytest.fixture
def bundle(rootfs, tmp_path, delegate):
    container_id = f"gpuckpt-it-{os.getpid()}-{delegate}"
    yield make_bundle(rootfs, tmp_path), rootfs, container_id
    sh(RUNTIME, "--root", RUNTIME_ROOT, "delete", "-f", container_id, check=False)


def test_bundle_checkpoint_restore(bundle, tmp_path) -> None:
    bundle_dir, rootfs, container_id = bundle
    (rootfs / "tmp" / "state").unlink(missing_ok=True)  # the rootfs is shared by the runc and crun runs
    detached("run", "-d", "--pid-file", str(tmp_path / "pid"), container_id, cwd=bundle_dir)
    read_state = lambda: (rootfs / "tmp" / "state").read_text()  # noqa: E731
    before = wait_counter(read_state, minimum=3)
    images = tmp_path / "images"
    runtime("checkpoint", "--image-path", str(images), container_id)
    assert runtime("state", container_id, check=False).returncode != 0  # gone after the dump
    pid_file = tmp_path / "restored.pid"
    detached("restore", "-d", "--bundle", str(bundle_dir), "--image-path", str(images),
             "--pid-file", str(pid_file), container_id, cwd=bundle_dir)
    state = json.loads(runtime("state", container_id).stdout)
    assert state["status"] == "running" and int(pid_file.read_text()) == state["pid"]
    assert_continues(before, read_state)


# The counter's buffer in a 6 MiB /dev/shm file that stays open after it is unlinked, the way
# NCCL's shared-memory transport holds its segments: CRIU must copy it into the image as a
# "ghost file", which it refuses above 1 MiB unless told (the shim raises the limit). The
# checksum is read back from the deleted file on every tick.
GHOST_BUFFER = (
    "fd = os.open('/dev/shm/segment', os.O_RDWR | os.O_CREAT, 0o600)\n"
    "os.write(fd, os.urandom(6 << 20))\n"
    "os.unlink('/dev/shm/segment')\n"
)


def test_deleted_shared_memory_is_carried_with_a_raised_ghost_limit(bundle, tmp_path) -> None:
    bundle_dir, rootfs, container_id = bundle
    spec = json.loads((bundle_dir / "config.json").read_text())
    source = COUNTER_SOURCE.replace("buffer = bytearray(os.urandom(16 << 20))\n", GHOST_BUFFER)
    source = source.replace("hashlib.sha256(buffer)", "hashlib.sha256(os.pread(fd, 6 << 20, 0))")
    assert source.count("os.pread") == 2
    spec["process"]["args"] = ["python3", "-c", source]
    (bundle_dir / "config.json").write_text(json.dumps(spec))
    (rootfs / "tmp" / "state").unlink(missing_ok=True)
    detached("run", "-d", container_id, cwd=bundle_dir)
    read_state = lambda: (rootfs / "tmp" / "state").read_text()  # noqa: E731
    before = wait_counter(read_state, minimum=3)
    images = tmp_path / "images"
    runtime("checkpoint", "--image-path", str(images), container_id)
    manifest = json.loads((images / "gpuckpt-manifest.json").read_text())
    assert manifest["criu_config"] == [f"ghost-limit {6 << 20}"]
    detached("restore", "-d", "--bundle", str(bundle_dir), "--image-path", str(images), container_id, cwd=bundle_dir)
    assert_continues(before, read_state)  # same token, and the mapped segment's checksum unchanged


# runc's own test "checkpoint and restore with container specific CRIU config"
# (tests/integration/checkpoint.bats): a root-owned temporary file in /tmp named by the
# annotation org.criu.config sets CRIU's log-file, and the log must appear in the work
# directory at checkpoint and at restore. Two parts are left out: its /etc/criu/default.conf
# (a node-wide file every other test's CRIU beside this one would read) and
# --manage-cgroups-mode ignore (runc 1.1 has no such mode).


@pytest.fixture
def annotated(rootfs, tmp_path):
    """A runc bundle whose spec names a CRIU config file the way runc's test makes it, and a
    config of the test's own (GPUCKPT_CONFIG: the node's file is shared with the tests beside)."""
    fd, criu_config = tempfile.mkstemp(prefix="runc-criu-", suffix=".conf", dir="/tmp")
    log_name = f"runc-criu-log-{uuid.uuid4().hex[:8]}.log"
    os.write(fd, f"log-file={log_name}\n".encode())
    os.close(fd)
    bundle = make_bundle(rootfs, tmp_path, annotations={"org.criu.config": criu_config})
    container_id = f"gpuckpt-it-criuconf-{os.getpid()}"
    (rootfs / "tmp" / "state").unlink(missing_ok=True)
    config = tmp_path / "config.toml"
    config.write_text('delegate = "runc"\n')
    config.chmod(0o644)
    env = {**os.environ, "GPUCKPT_CONFIG": str(config)}
    yield bundle, container_id, criu_config, log_name, config, env
    sh(RUNTIME, "--root", RUNTIME_ROOT, "delete", "-f", container_id, check=False, env=env)
    os.unlink(criu_config)


ALLOW_TMP = '[criu]\nallow_container_config = true\ncontainer_config_dirs = ["/tmp"]\n'


def read_counter(rootfs: Path):
    return lambda: (rootfs / "tmp" / "state").read_text()


def test_runcs_criu_config_test_passes_once_the_operator_allows_it(annotated, rootfs, tmp_path) -> None:
    bundle_dir, container_id, _, log_name, config, env = annotated
    config.write_text(config.read_text() + ALLOW_TMP)
    detached("run", "-d", container_id, cwd=bundle_dir, env=env)
    before = wait_counter(read_counter(rootfs), minimum=3)
    work = tmp_path / "work-dir"
    runtime("checkpoint", "--work-path", str(work), "--image-path", str(tmp_path / "images"),
            container_id, env=env)
    assert (work / log_name).exists(), sorted(os.listdir(work))
    (work / log_name).unlink()
    detached("restore", "-d", "--work-path", str(work), "--image-path", str(tmp_path / "images"),
             "--bundle", str(bundle_dir), container_id, cwd=bundle_dir, env=env)
    assert (work / log_name).exists(), sorted(os.listdir(work))
    assert json.loads(runtime("state", container_id, env=env).stdout)["status"] == "running"
    assert_continues(before, read_counter(rootfs))


@pytest.mark.hostile("runc bundle annotated org.criu.config (runc's own test), operator's default policy")
def test_runcs_criu_config_test_is_refused_by_default(annotated, rootfs, tmp_path) -> None:
    bundle_dir, container_id, criu_config, _, config, env = annotated
    detached("run", "-d", container_id, cwd=bundle_dir, env=env)
    before = wait_counter(read_counter(rootfs), minimum=3)
    work, images = tmp_path / "work-dir", tmp_path / "images"
    refused = runtime("checkpoint", "--work-path", str(work), "--image-path", str(images), container_id,
                      check=False, env=env)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"container {container_id} carries the annotation org.criu.config={criu_config!r}: a CRIU configuration "
        "chosen by the container is refused; the operator may allow it with criu.allow_container_config = true "
        f"in {config}")
    assert not images.exists() or not os.listdir(images)  # nothing dumped, no manifest
    assert json.loads(runtime("state", container_id, env=env).stdout)["status"] == "running"
    assert_continues(before, read_counter(rootfs))


@pytest.mark.hostile("restore bundle annotated org.criu.config=<path> (key split at '='), operator allows container "
                     "configs")
def test_a_split_criu_config_key_in_the_restore_bundle_is_refused(annotated, rootfs, tmp_path) -> None:
    """The image was made without the annotation; the restore bundle carries it inside the key."""
    bundle_dir, container_id, criu_config, _, config, env = annotated
    spec = json.loads((bundle_dir / "config.json").read_text())
    spec["annotations"] = {}
    (bundle_dir / "config.json").write_text(json.dumps(spec))
    detached("run", "-d", container_id, cwd=bundle_dir, env=env)
    wait_counter(read_counter(rootfs), minimum=3)
    images = tmp_path / "images"
    runtime("checkpoint", "--image-path", str(images), container_id, env=env)
    config.write_text(config.read_text() + ALLOW_TMP)
    spec["annotations"] = {f"org.criu.config={criu_config}": ""}
    (bundle_dir / "config.json").write_text(json.dumps(spec))
    refused = runtime("restore", "-d", "--bundle", str(bundle_dir), "--image-path", str(images), container_id,
                      check=False, env=env)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "runc splits labels at the first '=' and would act on it as org.criu.config" in refused.stderr
    assert runtime("state", container_id, check=False, env=env).returncode != 0  # nothing was restored


# Device-node sync on restore acts on the /dev the runtime made, never through a root the
# container chose: a real runc container whose init chroots into a host directory bind-mounted
# as a volume (CAP_SYS_CHROOT, which docker grants by default), next to one that does not.
CHROOT_INIT = "import os, time; os.chroot('/mnt/volume'); os.chdir('/'); time.sleep(600)"


@pytest.fixture
def gpu_container(rootfs, tmp_path):
    started = []
    config = tmp_path / "config.toml"
    config.write_text('delegate = "runc"\n')
    config.chmod(0o644)
    env = {**os.environ, "GPUCKPT_CONFIG": str(config)}  # the node's file is shared with the tests beside

    def start(chroot: bool) -> tuple[int, Path]:
        volume = tmp_path / f"volume-{len(started)}"
        (volume / "dev").mkdir(parents=True)
        os.mknod(volume / "dev" / "nvidia0", 0o600 | stat.S_IFCHR, os.makedev(195, 0))  # looks stale to the sync
        bundle_dir = tmp_path / f"b{len(started)}"
        bundle_dir.mkdir()
        spec = json.loads((make_bundle(rootfs, bundle_dir) / "config.json").read_text())
        spec["process"]["args"] = ["python3", "-c", CHROOT_INIT if chroot else "import time; time.sleep(600)"]
        spec["process"]["capabilities"] = {kind: ["CAP_SYS_CHROOT"] for kind in ("bounding", "effective", "permitted")}
        spec["mounts"].append({"destination": "/mnt/volume", "type": "bind", "source": str(volume),
                               "options": ["rbind", "rw"]})
        (bundle_dir / "bundle" / "config.json").write_text(json.dumps(spec))
        container_id = f"gpuckpt-it-devnodes-{os.getpid()}-{len(started)}"
        started.append(container_id)
        detached("run", "-d", "--pid-file", str(bundle_dir / "pid"), container_id, cwd=bundle_dir / "bundle", env=env)
        pid = int((bundle_dir / "pid").read_text())
        deadline = time.monotonic() + 10
        while chroot and os.readlink(f"/proc/{pid}/root") != "/mnt/volume":  # as its mount namespace names it
            assert time.monotonic() < deadline, "the container's init did not chroot"
            time.sleep(0.05)
        return pid, volume

    yield start
    for container_id in started:
        sh(RUNTIME, "--root", RUNTIME_ROOT, "delete", "-f", container_id, check=False, env=env)


NVIDIA1 = Device(path="/dev/nvidia1", type="c", major=195, minor=1, fileMode=0o666)


@pytest.mark.hostile("restored container whose init chrooted into a host volume, at device-node sync")
def test_device_nodes_never_follow_a_root_the_container_chose(gpu_container, rootfs) -> None:
    pid, volume = gpu_container(chroot=True)
    with pytest.raises(GpuCheckpointError) as raised:
        sync_nvidia_nodes(pid, [NVIDIA1], str(rootfs))
    assert str(raised.value).startswith(f"restored process {pid} has a root other than the container's rootfs {rootfs}")
    assert sorted(os.listdir(volume / "dev")) == ["nvidia0"]  # the host directory is untouched
    assert not (rootfs / "dev" / "nvidia1").exists()


def test_device_nodes_go_into_the_dev_the_runtime_made(gpu_container, rootfs) -> None:
    pid, volume = gpu_container(chroot=False)
    assert sync_nvidia_nodes(pid, [NVIDIA1], str(rootfs)) == ["created /dev/nvidia1 (195:1)"]
    made = os.lstat(f"/proc/{pid}/root/dev/nvidia1")  # in the container's /dev tmpfs
    assert stat.S_ISCHR(made.st_mode) and made.st_rdev == os.makedev(195, 1)
    assert not (rootfs / "dev" / "nvidia1").exists() and sorted(os.listdir(volume / "dev")) == ["nvidia0"]
