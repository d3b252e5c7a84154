"""CRIU's link-remap names in a container that a leave-running dump left running: put back after it, removed
before the next.

CRIU dumps a file held under a removed name while another name still links it (a POSIX named semaphore)
by linking it as link_remap.N beside that name; its restore links link_remap.N to the removed name again.
A dump that leaves the processes running removes link_remap.N as it ends (criu/cr-dump.c cr_dump_finish:
delete_link_remaps() when the final state is alive), and podman copies the container's /dev/shm into the
checkpoint (devshm-checkpoint.tar) only after the runtime returned: without the name the copy does not
restore. Phases: after the dump, the images say which link_remap name stands for which removed name
(oci/criu_images.py), the running processes hold the file under that name, and the name is linked again
in the container's tree (host/held_links.py: descriptors only). The name stays in the running container;
before its next dump with link-remap it is removed again, since CRIU picks the same one and its link would
fail on it. CRIU has no option that keeps its remaps on a dump that leaves the processes running.
"""

from __future__ import annotations

import posixpath

from ..errors import ImageError
from ..host.held_links import held_files, link_in_root, remove_links_in_root
from ..host.processes import Processes
from ..oci.criu_images import LINK_REMAP_NAME, LinkRemap, directory_source, read_link_remaps


def put_back_link_remaps(image_dir: str, processes: Processes, root_pid: int) -> list[LinkRemap]:
    """Each link_remap name the dump in `image_dir` made, linked again to the file the processes hold under
    the removed name it stands for, in the root of process `root_pid` (the container's init); the remaps.
    ImageError (the checkpoint would not restore) where one cannot be."""
    remaps = read_link_remaps(directory_source(image_dir), image_dir)
    for remap in remaps:
        with held_files(processes.pids, remap.removed_name) as held:
            if len(held) != 1:
                why = ("no process holds it any more, or its last other name is gone" if not held else
                       f"the processes hold {len(held)} different files under that name")
                raise ImageError(f"CRIU's {remap.remap_name} for {remap.removed_name} (held under a removed name) "
                                 f"cannot be put back: {why}")
            try:
                link_in_root(held[0], root_pid, remap.remap_name)
            except OSError as error:
                raise ImageError(f"CRIU's {remap.remap_name} for {remap.removed_name} (held under a removed name) "
                                 f"cannot be put back: {error.strerror or error}") from None
    return remaps


def remove_left_link_remaps(processes: Processes, root_pid: int) -> list[str]:
    """The link_remap.N names beside the files the processes hold under a removed name that link those very
    files (put back after an earlier dump), removed; their paths."""
    removed: list[str] = []
    for path in sorted(processes.deleted_but_linked()):
        with held_files(processes.pids, path) as held:
            try:
                removed += remove_links_in_root(held, root_pid, posixpath.dirname(path), LINK_REMAP_NAME)
            except OSError:
                continue  # its directory is gone or a link: nothing of ours there
    return removed
