"""A restored container's /dev/nvidia* nodes follow the restore spec, in a real mount namespace.

The "container" is a process unshared into its own mount namespace with a tmpfs on
/dev holding the nodes its checkpoint-time spec had, as CRIU restores them; its rootfs
is the host's / (seen through its own mounts).
"""

from __future__ import annotations

import os
import stat
import subprocess
import time

import pytest

from gpuckpt.errors import GpuCheckpointError
from gpuckpt.oci.spec import Device
from gpuckpt.shim.devnodes import sync_nvidia_nodes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces and mknod need root (CI runs as root)")


@pytest.fixture
def container():
    """pid of a process whose /dev is a private tmpfs holding nvidia0, nvidiactl and a file."""
    script = ("mount -t tmpfs tmpfs /dev && mknod /dev/nvidia0 c 195 0 && mknod /dev/nvidiactl c 195 255 "
              "&& echo keep > /dev/nvidia-notes && touch /dev/ready && exec sleep 300")
    child = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    deadline = time.monotonic() + 10
    while not os.path.exists(f"/proc/{child.pid}/root/dev/ready"):
        assert time.monotonic() < deadline and child.poll() is None, "the test namespace did not come up"
        time.sleep(0.02)
    yield child.pid
    child.kill()
    child.wait()


def nodes(pid: int) -> dict[str, tuple[int, int, int]]:
    found = {}
    for name in os.listdir(f"/proc/{pid}/root/dev"):
        status = os.lstat(f"/proc/{pid}/root/dev/{name}")
        found[name] = (os.major(status.st_rdev), os.minor(status.st_rdev), status.st_mode & 0o7777)
    return found


def gpu(minor: int, path: str | None = None, **extra) -> Device:
    return Device(path=path or f"/dev/nvidia{minor}", type="c", major=195, minor=minor, **extra)


def test_restored_onto_another_gpu_gets_the_new_node_and_loses_the_old(container) -> None:
    changes = sync_nvidia_nodes(container, [gpu(1, fileMode=0o660), gpu(255, "/dev/nvidiactl")], "/")
    assert changes == ["removed /dev/nvidia0", "created /dev/nvidia1 (195:1)"]
    found = nodes(container)
    assert found["nvidia1"] == (195, 1, 0o660)
    assert "nvidia0" not in found and found["nvidiactl"][:2] == (195, 255)
    assert "nvidia-notes" in found  # nothing but stale GPU nodes is removed
    assert not os.path.exists("/dev/nvidia1") or os.stat("/dev/nvidia1").st_ino != os.stat(
        f"/proc/{container}/root/dev/nvidia1").st_ino  # the host's /dev was not touched


def test_same_gpus_change_nothing(container) -> None:
    before = nodes(container)
    assert sync_nvidia_nodes(container, [gpu(0), gpu(255, "/dev/nvidiactl")], "/") == []
    assert nodes(container) == before


def test_a_node_with_the_wrong_number_is_replaced(container) -> None:
    assert sync_nvidia_nodes(container, [gpu(3, "/dev/nvidia0")], "/") == [
        "removed /dev/nvidia0",
        "created /dev/nvidia0 (195:3)",
    ]
    assert nodes(container)["nvidia0"][:2] == (195, 3)


def test_paths_outside_dev_and_other_devices_are_ignored(container) -> None:
    before = nodes(container)
    hostile = [gpu(1, "/dev/../tmp/nvidia1"), gpu(1, "/dev/sub/nvidia1"), gpu(1, "/etc/nvidia1"),
               Device(path="/dev/sda", type="b", major=8, minor=0)]
    assert sync_nvidia_nodes(container, hostile, "/") == []
    assert nodes(container) == before
    assert not os.path.exists("/tmp/nvidia1")


@pytest.fixture
def chrooted(tmp_path):
    """A process in its own mount namespace that chrooted into a directory of the host (a volume),
    whose dev/ holds a stale-looking GPU node and a link to /etc."""
    volume = tmp_path / "volume"
    (volume / "dev").mkdir(parents=True)
    os.mknod(volume / "dev" / "nvidia0", 0o600 | stat.S_IFCHR, os.makedev(195, 0))
    os.symlink("/etc", volume / "dev" / "nvidia-etc")
    chrooted = "import os, sys, time; os.chroot(sys.argv[1]); time.sleep(300)"
    child = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "python3", "-c", chrooted, str(volume)])
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{child.pid}/root") != str(volume):
        assert time.monotonic() < deadline and child.poll() is None, "the chrooted process did not come up"
        time.sleep(0.02)
    yield child.pid, volume
    child.kill()
    child.wait()


@pytest.mark.hostile("restored init chrooted into a host volume holding a dev/ directory")
def test_a_root_the_container_chose_is_never_followed(chrooted) -> None:
    pid, volume = chrooted
    before = sorted(os.listdir(volume / "dev"))
    with pytest.raises(GpuCheckpointError) as raised:
        sync_nvidia_nodes(pid, [gpu(1)], "/")
    assert str(raised.value) == (
        f"restored process {pid} has a root other than the container's rootfs / (it changed its root, e.g. chroot): "
        "its NVIDIA device nodes are only set up in the /dev the runtime made")
    assert sorted(os.listdir(volume / "dev")) == before  # the stale node stays, no nvidia1
    assert not os.path.exists("/etc/nvidia1")


def test_the_rootfs_named_by_the_spec_is_where_the_nodes_go(chrooted) -> None:
    """Control: the same process, with the volume as the spec's rootfs, is synced inside it only."""
    pid, volume = chrooted
    assert sync_nvidia_nodes(pid, [gpu(1)], str(volume)) == ["removed /dev/nvidia0", "created /dev/nvidia1 (195:1)"]
    assert sorted(os.listdir(volume / "dev")) == ["nvidia-etc", "nvidia1"]
    assert not os.path.exists("/etc/nvidia1")


def test_a_dev_that_is_a_symlink_is_refused(tmp_path) -> None:
    """A container whose /dev is a link to a host-looking path: the shim opens nothing through it."""
    root = tmp_path / "root"
    root.mkdir()
    os.symlink("/etc", root / "dev")
    chrooted = "import os, sys, time; os.chroot(sys.argv[1]); time.sleep(300)"
    child = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "python3", "-c", chrooted, str(root)])
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{child.pid}/root") != str(root):
            assert time.monotonic() < deadline and child.poll() is None, "the chrooted process did not come up"
            time.sleep(0.02)
        with pytest.raises(GpuCheckpointError, match=f"cannot open /dev of restored process {child.pid}"):
            sync_nvidia_nodes(child.pid, [gpu(1)], str(root))
        assert not os.path.exists("/etc/nvidia1")
    finally:
        child.kill()
        child.wait()


def test_a_process_sharing_the_host_mounts_is_left_alone() -> None:
    assert sync_nvidia_nodes(os.getpid(), [gpu(7)], "/") == []
    assert not os.path.exists("/dev/nvidia7")


def test_a_vanished_process_is_a_clear_error() -> None:
    with pytest.raises(GpuCheckpointError, match="mount namespace of restored process"):
        sync_nvidia_nodes(2**22 + 1, [gpu(0)], "/")
