"""A container's /dev/shm as it was at a leave-running dump: copied while the processes are frozen, into the
CRIU image directory (signed with the dump), and applied at an import in place of podman's later copy.

podman 4.3 tars /dev/shm (devshm-checkpoint.tar) only after the runtime's dump returned (libpod checkpoint():
CheckpointContainer, then the /dev/shm tar, then exportCheckpoint). With --leave-running the processes run
on meanwhile, so that copy is of a later moment than their memory: what they keep in /dev/shm files (a
semaphore's count, a hand-over's sequence numbers: multiprocessing's queues, a DataLoader's workers) no
longer matches them, and the imported processes wait for ever. The copy here: the top level's regular files,
hard links kept as links (a named semaphore and CRIU's link_remap name are one file), read through
descriptors in the container's root without following a link, bounded in bytes and entries. A /dev/shm that
holds anything else, or more, is left to podman's copy, and the caller is told why.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tarfile

from ..host.held_links import directory_in_root
from ..host.safefiles import create_new

DUMP_DEVSHM = "gpuckpt-devshm.tar"  # in the CRIU image directory: the dump signature covers it
MAX_DEVSHM_BYTES = 1 << 30  # written to the image directory while the container is frozen
MAX_DEVSHM_FILES = 10_000


class NotCopied(Exception):
    """Why the container's /dev/shm was not copied (podman's later copy stands)."""


def copy_devshm(root_pid: int, image_dir: str) -> tuple[int, int]:
    """The /dev/shm of process `root_pid`'s root (the container's init), as a tar at `image_dir`/DUMP_DEVSHM; its
    (files, bytes). NotCopied, with nothing left behind, where it holds anything but regular files or more than the
    bounds."""
    try:
        with directory_in_root(root_pid, "/dev/shm", listable=True) as shm:
            return copy_directory(shm, os.path.join(image_dir, DUMP_DEVSHM))
    except OSError as error:
        raise NotCopied(f"/dev/shm cannot be opened in its root: {error.strerror or error}") from None


def copy_directory(directory_fd: int, path: str) -> tuple[int, int]:
    """The regular files of the directory open at `directory_fd`, as a tar at `path`; (files, bytes). NotCopied,
    with no tar left, where it holds anything else or more than the bounds."""
    try:
        names = sorted(os.listdir(directory_fd))
        if len(names) > MAX_DEVSHM_FILES:
            raise NotCopied(f"it holds {len(names)} entries, more than {MAX_DEVSHM_FILES}")
        with os.fdopen(create_new(path), "wb") as out, tarfile.open(fileobj=out, mode="w",
                                                                    format=tarfile.PAX_FORMAT) as tar:
            return _write_files(tar, directory_fd, names)
    except (NotCopied, OSError, tarfile.TarError) as error:
        with contextlib.suppress(OSError):
            os.unlink(path)
        if isinstance(error, NotCopied):
            raise
        raise NotCopied(getattr(error, "strerror", None) or str(error)) from None


def _write_files(tar: tarfile.TarFile, shm: int, names: list[str]) -> tuple[int, int]:
    first_name: dict[tuple[int, int], str] = {}
    total = 0
    for name in names:
        found = os.stat(name, dir_fd=shm, follow_symlinks=False)
        if not stat.S_ISREG(found.st_mode):  # before any open: a device node or a FIFO is never opened
            raise NotCopied(f"{name!r} is not a regular file")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=shm)
        with os.fdopen(fd, "rb") as source:
            status = os.fstat(fd)
            if (status.st_dev, status.st_ino) != (found.st_dev, found.st_ino) or not stat.S_ISREG(status.st_mode):
                raise NotCopied(f"{name!r} changed while it was copied")
            if status.st_mode & (stat.S_ISUID | stat.S_ISGID):  # a restore applies no set-id file (attack30m F1)
                raise NotCopied(f"{name!r} is set-user-ID or set-group-ID")
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid = stat.S_IMODE(status.st_mode), status.st_uid, status.st_gid
            info.mtime = int(status.st_mtime)
            if (linked := first_name.get((status.st_dev, status.st_ino))) is not None:
                info.type, info.linkname = tarfile.LNKTYPE, linked  # one file under two names stays one
                tar.addfile(info)
                continue
            first_name[(status.st_dev, status.st_ino)] = name
            total += status.st_size
            if total > MAX_DEVSHM_BYTES:
                raise NotCopied(f"its files hold more than {MAX_DEVSHM_BYTES >> 20} MiB")
            info.size = status.st_size
            tar.addfile(info, source)
    return len(first_name), total


def dump_devshm(image_dir: str) -> str:
    """The /dev/shm copied at the dump in `image_dir`, or "" where there is none."""
    path = os.path.join(image_dir, DUMP_DEVSHM)
    return path if os.path.isfile(path) and not os.path.islink(path) else ""
