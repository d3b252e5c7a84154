"""Reading other processes' state from /proc: their file descriptors and mappings, their PID
inside the container, whether they are stopped, the process tree below one.

Processes come and go while we look: anything that vanished is skipped, never an error.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator


def open_fds(pid: int) -> list[tuple[str, str]]:
    """(fd, target) of every open fd of `pid`: target "/dev/nvidia0", "socket:[1234]", ...
    The links are read, never followed; [] if it is gone. Every one: a policy that missed one past a
    cut-off would pass what it must refuse."""
    return _links(pid, "fd")


def fd_entries(pids: Iterable[int]) -> Iterator[tuple[int, str, str]]:
    """(pid, fd, target) for every open fd of `pids`: target "/dev/nvidia0", "socket:[1234]", ..."""
    for pid in pids:
        for fd, target in open_fds(pid):
            yield pid, fd, target


def fd_targets(pids: Iterable[int]) -> Iterator[tuple[int, str]]:
    """(pid, target) for every open fd of `pids`."""
    return ((pid, target) for pid, _, target in fd_entries(pids))


def fd_file_locks(pid: int, fd: str) -> int:
    """How many file locks (POSIX, OFD, flock) one open file holds: the "lock:" lines of its fdinfo."""
    try:  # every kind of file: CRIU reads the "lock:" lines of pipes', sockets' and eventfds' fdinfo too
        with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as info:
            return sum(line.startswith(b"lock:") for line in info)
    except OSError:
        return 0  # closed meanwhile


# Deleted files that CRIU handles by other means than copying them ("ghost files").
_NOT_GHOSTS = ("/memfd:", "/SYSV", "/dev/zero", "/anon_hugepage")


def deleted_files(pid: int, fds: list[tuple[str, str]] | None = None) -> list[tuple[str, os.stat_result]]:
    """(path it had, stat) of every regular file `pid` holds open or mapped after its name was removed;
    `fds`: its open_fds() when they were read already (their links are not read again)."""
    found = []
    for kind in ("fd", "map_files"):
        links = fds if kind == "fd" and fds is not None else _links(pid, kind)
        for entry, target in links:
            if not target.endswith(" (deleted)") or target.startswith(_NOT_GHOSTS):
                continue
            try:
                status = os.stat(f"/proc/{pid}/{kind}/{entry}")  # the open file itself, reachable though unlinked
            except OSError:
                continue
            if stat.S_ISREG(status.st_mode):
                found.append((target.removesuffix(" (deleted)"), status))
    return found


def open_deleted(pid: int, path: str) -> list[int]:
    """O_PATH descriptors (the caller closes them) of the regular files `pid` holds open or mapped under
    the removed name `path`: /proc's fd and map_files links lead to the open file itself, the kernel's
    object, never through a name the process could have put there."""
    found = []
    for kind in ("fd", "map_files"):
        for entry, target in _links(pid, kind):
            if target != f"{path} (deleted)":
                continue
            try:
                fd = os.open(f"/proc/{pid}/{kind}/{entry}", os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # closed or unmapped meanwhile
            if stat.S_ISREG(os.fstat(fd).st_mode):
                found.append(fd)
            else:
                os.close(fd)
    return found


def _links(pid: int, kind: str) -> list[tuple[str, str]]:
    """(entry, target) of /proc/PID/<kind> (fd, map_files), each link read, never followed; [] if it is gone."""
    try:
        entries = os.listdir(f"/proc/{pid}/{kind}")
    except OSError:
        return []
    links = []
    for entry in entries:
        try:
            links.append((entry, os.readlink(f"/proc/{pid}/{kind}/{entry}")))
        except OSError:
            continue  # closed or unmapped meanwhile
    return links


def named_mappings(pid: int) -> list[str]:
    """The pathname of every named mapping of `pid`: "/usr/lib/libc.so.6",
    "anon_inode:[io_uring]", ...; [] if it is gone."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            lines = maps.readlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6:
            found.append(fields[5].rstrip("\n"))
    return found


def container_pid(host_pid: int) -> int:
    """The PID a process has inside its own PID namespace (NSpid's last field)."""
    try:
        with open(f"/proc/{host_pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return host_pid


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (state first); [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def is_stopped(pid: int) -> bool:
    """Stopped by a signal or a tracer (state T or t in /proc/PID/stat)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in ("T", "t")


def live_start_time(pid: int) -> int | None:
    """start_time() of a process still running: None once it is gone or only a zombie left for its reaper
    (it holds nothing then; init may be slow to reap what it inherited)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 and fields[0] != "Z" else None


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat's 22nd field); with the PID it
    names one process, as a PID alone does not once the process ended. None if it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else None


def children(pid: int) -> list[int]:
    """The processes `pid`'s threads forked, from /proc's children lists; [] if it is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as listed:
                found.extend(int(child) for child in listed.read().split())
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from /proc's children lists (independent of cgroups)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(children(current))
    return found


def container_processes(listed: Iterable[int], init_pid: int) -> list[int]:
    """The runtime's list of a container's PIDs (its cgroup) joined with init's process tree,
    which also holds processes CRIU restored outside that cgroup."""
    return sorted(set(listed) | set(descendants(init_pid)))


def resident_bytes(pids: Iterable[int]) -> int:
    """The resident memory of these processes (/proc/PID/statm), gone ones counted as nothing."""
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total
