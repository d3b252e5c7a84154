"""The storage roots podman gave the conmon that started this runtime: where the container's own directories are.

podman starts conmon, conmon starts the runtime, for every create and restore, and hands conmon the command
that cleans up after the container: `podman ... --root GRAPHROOT --runroot RUNROOT ... container cleanup`,
each word as `--exit-command-arg WORD` (podman's CreateExitCommandArgs, from podman's own storage
configuration). The container's config (an archive's config.dump under podman's own --import) sets its name,
log and pid file paths on conmon's command line, never these: the words come from the podman that runs, the
operator's. Read from /proc: the runtime's parent, only a process whose executable is named conmon.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ImageError
from .safefiles import read_bounded

MAX_CMDLINE_BYTES = 256 << 10
EXIT_ARG = "--exit-command-arg"


@dataclass(frozen=True)
class StorageRoots:
    graph_root: str
    run_root: str


def parent_pid(pid: int) -> int:
    """`pid`'s parent from /proc/PID/stat (the field after the command name, which may hold spaces)."""
    text = read_bounded(f"/proc/{pid}/stat", 4096, f"/proc/{pid}/stat").decode("ascii", "replace")
    return int(text.rpartition(")")[2].split()[1])


def conmon_storage_roots(runtime_pid: int) -> StorageRoots | None:
    """The graph and run roots of the podman whose conmon started process `runtime_pid`; None if its parent is
    not conmon, or its exit command names no plain absolute roots."""
    try:
        conmon = parent_pid(runtime_pid)
        if os.path.basename(os.readlink(f"/proc/{conmon}/exe")) != "conmon":
            return None
        words = read_bounded(f"/proc/{conmon}/cmdline", MAX_CMDLINE_BYTES, "conmon's command line").split(b"\0")
    except (OSError, ValueError, IndexError, ImageError):
        return None
    exit_command, at = [], 1
    while at < len(words):  # each --exit-command-arg takes the next word, whatever it is
        if words[at] == EXIT_ARG.encode() and at + 1 < len(words):
            exit_command.append(words[at + 1].decode("utf-8", "replace"))
            at += 2
        else:
            at += 1
    roots: dict[str, list[str]] = {"--root": [], "--runroot": []}
    for at, word in enumerate(exit_command[:-1]):
        if word in roots:
            roots[word].append(exit_command[at + 1])
    if any(len(found) != 1 for found in roots.values()):
        return None  # podman names each once
    graph, run = roots["--root"][0], roots["--runroot"][0]
    if not all(path.startswith("/") and os.path.normpath(path) == path for path in (graph, run)):
        return None
    return StorageRoots(graph, run)
