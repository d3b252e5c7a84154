"""Make a restored container's /dev/nvidia* nodes follow the restore spec.

CRIU restores the container's /dev (a tmpfs) from the image, so after `restore`
the container holds the device nodes of the spec it was checkpointed with; runc
does not create the new spec's nodes. A container restored onto another GPU then
has /dev/nvidia0 where its spec says /dev/nvidia1, and the driver cannot reach the
GPU it is asked to restore onto. Only character devices named /dev/nvidia* in the
spec's `linux.devices` are created, and only stale /dev/nvidiaN GPU nodes the spec
no longer lists are removed.

The /dev acted on is the one the runtime set up: reached from the restored process's
root only when that root is the container's rootfs from the restore spec (the same
directory on the host), never from a root the container chose for itself (its init
may chroot into a host volume). Every operation is relative to a directory descriptor
for that /dev, opened without following a link from the root's descriptor that was
checked, so nothing inside the container can point the shim (root, on the host) at a
host path.
"""

from __future__ import annotations

import os
import re
import stat
from typing import TYPE_CHECKING

from ..errors import GpuCheckpointError

if TYPE_CHECKING:
    from ..oci.spec import Device

GPU_NODE = re.compile(r"^nvidia\d+$")
NVIDIA_NODE = re.compile(r"^nvidia[A-Za-z0-9-]*$")
NVIDIA_MAJOR = 195


def _wanted(devices: list[Device]) -> dict[str, tuple[int, int, int, int]]:
    """name -> (rdev, mode, uid, gid) for the spec's NVIDIA character devices directly in /dev."""
    wanted = {}
    for device in devices:
        name = device.path.removeprefix("/dev/")
        if device.type != "c" or not device.path.startswith("/dev/") or not NVIDIA_NODE.match(name):
            continue
        if device.major is None or device.minor is None:
            continue
        mode = device.fileMode if device.fileMode is not None else 0o666
        wanted[name] = (os.makedev(device.major, device.minor), mode & 0o777, device.uid or 0, device.gid or 0)
    return wanted


def _shares_our_mounts(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino
    except OSError as error:
        raise GpuCheckpointError(
            f"cannot read the mount namespace of restored process {pid}: {error.strerror}"
        ) from None


def _container_dev(pid: int, rootfs: str) -> int:
    """A descriptor for the /dev the runtime set up in the container of process `pid`."""
    try:
        expected = os.stat(rootfs) if rootfs else None  # the engine's directory; the container cannot rename it
    except OSError as error:
        raise GpuCheckpointError(f"cannot read the container's rootfs {rootfs}: {error.strerror}") from None
    try:
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise GpuCheckpointError(f"cannot open the root of restored process {pid}: {error.strerror}") from None
    try:
        found = os.fstat(root)
        if expected is None or (found.st_dev, found.st_ino) != (expected.st_dev, expected.st_ino):
            raise GpuCheckpointError(
                f"restored process {pid} has a root other than the container's rootfs {rootfs or '(none in the spec)'} "
                "(it changed its root, e.g. chroot): its NVIDIA device nodes are only set up in the /dev the "
                "runtime made")
        try:
            return os.open("dev", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        except OSError as error:
            raise GpuCheckpointError(f"cannot open /dev of restored process {pid}: {error.strerror}") from None
    finally:
        os.close(root)


def sync_nvidia_nodes(pid: int, devices: list[Device], rootfs: str) -> list[str]:
    """Bring the container's /dev (process `pid`'s mount namespace, `rootfs` its root on the host)
    in line with `devices`; returns what changed."""
    wanted = _wanted(devices)
    if not wanted or _shares_our_mounts(pid):
        return []  # a process seeing the host's /dev is never the shim's to edit
    dev = _container_dev(pid, rootfs)
    changes = []
    try:
        present = {}
        for name in os.listdir(dev):
            if NVIDIA_NODE.match(name):
                present[name] = os.stat(name, dir_fd=dev, follow_symlinks=False)
        for name, found in present.items():
            stale_gpu = (GPU_NODE.match(name) and stat.S_ISCHR(found.st_mode)
                         and os.major(found.st_rdev) == NVIDIA_MAJOR and name not in wanted)
            moved = name in wanted and (not stat.S_ISCHR(found.st_mode) or found.st_rdev != wanted[name][0])
            if stale_gpu or moved:
                os.unlink(name, dir_fd=dev)
                changes.append(f"removed /dev/{name}")
        for name, (rdev, mode, uid, gid) in wanted.items():
            if name in present and f"removed /dev/{name}" not in changes:
                continue
            previous_umask = os.umask(0)  # the spec's mode exactly, with no chmod race after
            try:
                os.mknod(name, stat.S_IFCHR | mode, rdev, dir_fd=dev)
            finally:
                os.umask(previous_umask)
            os.chown(name, uid, gid, dir_fd=dev, follow_symlinks=False)
            changes.append(f"created /dev/{name} ({os.major(rdev)}:{os.minor(rdev)})")
    except OSError as error:
        raise GpuCheckpointError(f"cannot set up the NVIDIA device nodes of restored process {pid}: "
                                 f"{error.filename or ''} {error.strerror}".replace("  ", " ")) from None
    finally:
        os.close(dev)
    return changes
