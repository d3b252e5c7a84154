"""A container's processes as /proc showed them once: each one's open files with their targets and
locks, its named mappings, sockets, deleted files and children, read at the start of a checkpoint.

The policies judge this one snapshot (io_uring, sockets, file locks, ghost files, link-remap) and
the manifest records from it, instead of each going back to /proc for its own pass. Processes
come and go while it is read: one that vanished is recorded with what was read of it, never an
error. No link is followed, and every fd and mapping is read: one past a cut-off could hide what a
policy refuses (host/procfs.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from . import procfs

SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")


@dataclass(frozen=True)
class DeletedFile:
    """A regular file held open or mapped after its name was removed (CRIU's "ghost file")."""

    path: str  # the name it had
    size_bytes: int
    linked: bool  # still linked under another name (a POSIX named semaphore): CRIU needs link-remap


@dataclass(frozen=True)
class Process:
    pid: int
    container_pid: int  # its PID in its own PID namespace
    # What its open fds point at, each target once (links as read, never followed: "/dev/nvidia0",
    # "socket:[1234]", "/x (deleted)"): a process that dups one fd a million times is held as one
    fd_targets: frozenset[str]
    file_locks: int  # POSIX, OFD and flock locks its files hold (their fdinfo's "lock:" lines)
    mappings: tuple[str, ...]  # the pathnames of its named mappings, each once
    deleted_files: tuple[DeletedFile, ...]
    children: tuple[int, ...]

    @property
    def socket_inodes(self) -> frozenset[int]:
        return frozenset(int(match.group(1)) for target in self.fd_targets if (match := SOCKET_LINK.match(target)))

    def holds(self, target: str) -> bool:
        """Whether it has `target` open or mapped."""
        return target in self.mappings or target in self.fd_targets


@dataclass(frozen=True)
class Processes:
    """A container's processes, by PID order."""

    processes: tuple[Process, ...]

    def __iter__(self) -> Iterator[Process]:
        return iter(self.processes)

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def container_pid(self, pid: int) -> int:
        """`pid`'s PID in the container: as read, or read now for one the snapshot did not hold."""
        for process in self.processes:
            if process.pid == pid:
                return process.container_pid
        return procfs.container_pid(pid)

    @property
    def socket_inodes(self) -> set[int]:
        return {inode for process in self.processes for inode in process.socket_inodes}

    @property
    def file_locks(self) -> int:
        return sum(process.file_locks for process in self.processes)

    def deleted_file_sizes(self) -> dict[str, int]:
        """Deleted files no other name links: path -> size."""
        return {file.path: file.size_bytes for process in self.processes for file in process.deleted_files
                if not file.linked}

    def deleted_but_linked(self) -> set[str]:
        """Files held under a removed name while still linked elsewhere."""
        return {file.path for process in self.processes for file in process.deleted_files if file.linked}


def read_process(pid: int, children: Iterable[int] | None = None) -> Process:
    """One process as /proc shows it now (`children` when they were read already)."""
    fds = procfs.open_fds(pid)
    deleted = tuple(DeletedFile(path, status.st_size, status.st_nlink > 0)
                    for path, status in procfs.deleted_files(pid, fds))
    return Process(pid=pid, container_pid=procfs.container_pid(pid),
                   fd_targets=frozenset(target for _, target in fds),
                   file_locks=sum(procfs.fd_file_locks(pid, fd) for fd, _ in fds),
                   mappings=tuple(dict.fromkeys(procfs.named_mappings(pid))), deleted_files=deleted,
                   children=tuple(procfs.children(pid) if children is None else children))


def read_processes(pids: Iterable[int]) -> Processes:
    """The processes `pids`, each read once."""
    return Processes(tuple(read_process(pid) for pid in sorted(set(pids))))


def read_container(listed: Iterable[int], init_pid: int) -> Processes:
    """The runtime's list of a container's PIDs (its cgroup) joined with init's process tree, which also
    holds processes CRIU restored outside that cgroup (procfs.container_processes), each read once."""
    tree: dict[int, list[int]] = {}
    pending = [init_pid]
    while pending:
        current = pending.pop()
        tree[current] = procfs.children(current)
        pending.extend(tree[current])
    return Processes(tuple(read_process(pid, tree.get(pid)) for pid in sorted(set(listed) | tree.keys())))
