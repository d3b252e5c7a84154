"""Reading other processes' state from /proc: what their file descriptors point at.

Processes come and go while we look: anything that vanished is skipped, never an error.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator


def fd_targets(pids: Iterable[int]) -> Iterator[tuple[int, str]]:
    """(pid, target) for every open fd of `pids`: "/dev/nvidia0", "socket:[1234]", ..."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                yield pid, os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile


# Deleted files that CRIU handles by other means than copying them ("ghost files").
_NOT_GHOSTS = ("/memfd:", "/SYSV", "/dev/zero", "/anon_hugepage")


def _deleted_files_held(pids: Iterable[int]) -> Iterator[tuple[str, os.stat_result]]:
    """(path it had, stat) of every regular file `pids` hold open or mapped after its name was removed."""
    for pid in pids:
        for kind in ("fd", "map_files"):
            try:
                entries = os.listdir(f"/proc/{pid}/{kind}")
            except OSError:
                continue
            for entry in entries:
                link = f"/proc/{pid}/{kind}/{entry}"
                try:
                    target = os.readlink(link)
                    if not target.endswith(" (deleted)") or target.startswith(_NOT_GHOSTS):
                        continue
                    status = os.stat(link)  # the open file itself, reachable though unlinked
                except OSError:
                    continue
                if stat.S_ISREG(status.st_mode):
                    yield target.removesuffix(" (deleted)"), status


def deleted_file_sizes(pids: Iterable[int]) -> dict[str, int]:
    """Regular files that `pids` hold open or mapped after they were deleted: path -> size."""
    return {path: status.st_size for path, status in _deleted_files_held(pids) if status.st_nlink == 0}


def mapped_targets(pids: Iterable[int]) -> Iterator[tuple[int, str]]:
    """(pid, pathname) for every named mapping of `pids`: "/usr/lib/libc.so.6", "anon_inode:[io_uring]", ..."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                lines = maps.readlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6:
                yield pid, fields[5].rstrip("\n")


def deleted_but_linked(pids: Iterable[int]) -> set[str]:
    """Files `pids` hold open or mapped under a name that was removed while the file itself is
    still linked elsewhere (glibc's sem_open maps a temporary name, links the real one and
    removes the temporary): CRIU dumps these only with `link-remap`."""
    return {path for path, status in _deleted_files_held(pids) if status.st_nlink > 0}
