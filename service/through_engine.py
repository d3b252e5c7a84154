"""One container checkpointed or restored through the engine that owns it, never around it.

podman: `gpuckpt export` (podman's checkpoint through gpuckpt-runtime, a signed archive in the
archive directory) and, to restore, the exited container removed and `gpuckpt import`; docker:
`docker checkpoint create` (in docker's own store) and `docker start --checkpoint`. Each is a program
run through host/process.py; its last line of error is the container's report. A `gpuckpt export`
that fails puts its container back itself (node/put_back.py) and says so in that line; one past its
time is asked to stop (SIGTERM: it puts the container back), never killed with the container down.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence

from ..errors import GpuckptError
from ..host import process
from ..host.programs import CommandError, find_program
from ..node.container_record import ContainerRecord
from .api import DrainedContainer, DrainEngine
from .group import GROUP_LABEL

CHECKPOINT_NAME = "gpuckpt-drain"  # docker's name for the drain's checkpoint
ENGINE_TIMEOUT_S = 3600.0


def _gpuckpt() -> str:
    found = find_program("gpuckpt")
    if found is None:
        raise GpuckptError("gpuckpt (the CLI) is not on PATH: the service moves podman containers with it")
    return found


DRAINED_ENGINES = ("podman", "docker")  # the engines the service acts through


def is_running(record: ContainerRecord) -> bool:
    if record.engine not in DRAINED_ENGINES:
        return False
    state = process.run([record.engine, "inspect", "--format", "{{.State.Running}}", record.id],
                        timeout_s=60, check=False)
    return state.returncode == 0 and state.stdout.strip() == "true"


def exists(engine: str, container_id: str) -> bool:
    """Whether the engine still knows the container (podman runs no poststop hook for a container it
    restored, so its record can outlive it); True for an engine the service does not act through."""
    if engine not in DRAINED_ENGINES:
        return True  # not ours to judge: the record stays
    return process.run([engine, "inspect", "--format", "{{.Id}}", container_id], timeout_s=60,
                       check=False).returncode == 0


def name(engine: str, container_id: str) -> str | None:
    """The engine's name for the container, for people's lines (None: the engine does not answer)."""
    if engine not in DRAINED_ENGINES:
        return None
    found = process.run([engine, "inspect", "--format", "{{.Name}}", container_id], timeout_s=60, check=False)
    if found.returncode != 0:
        return None
    return found.stdout.strip().lstrip("/") or None  # docker's name has a leading /


def names(engine: str) -> dict[str, str] | None:
    """Every container's name by its full ID, as the engine lists them, in one call (None: it does not answer)."""
    if engine not in DRAINED_ENGINES:
        return None
    try:
        listed = process.run([engine, "ps", "--all", "--no-trunc", "--format", "{{.ID}} {{.Names}}"], timeout_s=60,
                             check=False)
    except (CommandError, OSError):
        return None
    if listed.returncode != 0:
        return None
    return {cid: named.lstrip("/") for cid, _, named in (line.partition(" ") for line in listed.stdout.splitlines())
            if named}


def removed(records: Sequence[ContainerRecord]) -> list[ContainerRecord]:
    """The records whose container its engine no longer has (podman runs no poststop hook for a container it
    restored, so `podman rm` of one leaves its record); an engine that does not answer vouches for its own."""
    gone = []
    for engine in sorted({record.engine for record in records}):
        listed = names(engine)
        if listed is not None:
            gone += [record for record in records if record.engine == engine and record.id not in listed]
    return gone


def _tree_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def checkpoint(record: ContainerRecord, archive_dir: str) -> tuple[DrainEngine, str, int]:
    """Checkpoint the container into `archive_dir` (it stops); the engine that did, where it went and
    how many bytes."""
    if record.engine == "podman":
        archive = os.path.join(archive_dir, f"{record.id}.tar.zst")
        _export([_gpuckpt(), "export", record.id, "-o", archive], ENGINE_TIMEOUT_S)
        return "podman", archive, _tree_bytes(archive) + _tree_bytes(f"{archive}.sig")
    if record.engine == "docker":
        # In docker's own checkpoint store: docker 20.10 writes to a --checkpoint-dir but refuses to
        # start from one ("custom checkpointdir is not supported").
        process.run(["docker", "checkpoint", "rm", record.id, CHECKPOINT_NAME], timeout_s=300, check=False)
        process.run(["docker", "checkpoint", "create", record.id, CHECKPOINT_NAME], timeout_s=ENGINE_TIMEOUT_S)
        root = process.run(["docker", "info", "--format", "{{.DockerRootDir}}"], timeout_s=60).stdout.strip()
        directory = os.path.join(root, "containers", record.id, "checkpoints", CHECKPOINT_NAME)
        return "docker", directory, _tree_bytes(directory) if os.path.isdir(directory) else 0
    raise GpuckptError(f"{record.engine} containers are not drained yet (podman and docker are)")


def _export(argv: Sequence[str], timeout_s: float) -> None:
    """`gpuckpt export` to its end; past `timeout_s` it gets SIGTERM and is waited for while it puts its container
    back (killed, it would leave it stopped): a CommandError with its last line either way."""
    export = process.Background(argv)
    try:
        export.popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        export.popen.send_signal(signal.SIGTERM)
        said = (export.wait(check=False).stderr.strip().splitlines() or ["no message"])[-1]
        raise CommandError(f"gpuckpt export: no end within {timeout_s:g} s, stopped: {said}") from None
    export.wait(check=True)


def restore(drained: DrainedContainer) -> None:
    """Bring a drained container back through its engine."""
    if drained.engine == "podman":
        if exists("podman", drained.id):
            process.run(["podman", "rm", "-f", drained.id], timeout_s=300)  # the exited one: the archive holds it
        # the archive is this node's own, signed here: the container config it carries ran here already
        process.run([_gpuckpt(), "import", "--trust-config", drained.checkpoint], timeout_s=ENGINE_TIMEOUT_S)
        return
    process.run(["docker", "start", "--checkpoint", CHECKPOINT_NAME, drained.id], timeout_s=ENGINE_TIMEOUT_S)


def discard(drained: DrainedContainer) -> None:
    """The checkpoint of a container restored from it."""
    if drained.engine == "docker":
        process.run(["docker", "checkpoint", "rm", drained.id, CHECKPOINT_NAME], timeout_s=300, check=False)
        return
    if os.path.isdir(drained.checkpoint):
        shutil.rmtree(drained.checkpoint, ignore_errors=True)
    else:
        for path in (drained.checkpoint, f"{drained.checkpoint}.sig"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def checkpoint_live(record: ContainerRecord, directory: str, name: str) -> tuple[str, int]:
    """A checkpoint that leaves the container running (--leave-running), named `name` in `directory`."""
    if record.engine == "podman":
        archive = os.path.join(directory, f"{name}.tar.zst")
        _export([_gpuckpt(), "export", "--leave-running", record.id, "-o", archive], ENGINE_TIMEOUT_S)
        return archive, _tree_bytes(archive) + _tree_bytes(f"{archive}.sig")
    if record.engine == "docker":
        process.run(["docker", "checkpoint", "create", "--leave-running", "--checkpoint-dir", directory, record.id,
                     name], timeout_s=ENGINE_TIMEOUT_S)
        return os.path.join(directory, name), _tree_bytes(os.path.join(directory, name))
    raise GpuckptError(f"{record.engine} containers are not checkpointed by the service yet (podman and docker are)")


def group_of(record: ContainerRecord) -> str:
    """The group a podman container belongs to (its label io.gpuckpt.group, "" for none): the service moves a
    group's members only together (a rank locked alone waits for ever on its peers)."""
    if record.engine != "podman":
        return ""
    found = process.run(["podman", "inspect", "--format", f'{{{{index .Config.Labels "{GROUP_LABEL}"}}}}', record.id],
                        timeout_s=60, check=False)
    label = found.stdout.strip() if found.returncode == 0 else ""
    return "" if label == "<no value>" else label


def checkpoint_group(label: str, *, leave_running: bool) -> dict[str, tuple[str, int]]:
    """`gpuckpt checkpoint --group LABEL` (in podman's own store): each member's ID, checkpoint directory and
    its bytes."""
    process.run([_gpuckpt(), "checkpoint", "--group", label, *(["--leave-running"] if leave_running else [])],
                timeout_s=ENGINE_TIMEOUT_S)
    members = process.run(["podman", "ps", "-a", "--filter", f"label={GROUP_LABEL}={label}", "--format", "{{.ID}}"],
                          timeout_s=60).stdout.split()
    found = {}
    for member in members:
        shown = process.run(["podman", "inspect", "--format", "{{.Id}} {{.StaticDir}}", member], timeout_s=60)
        container_id, static_dir = shown.stdout.split()
        directory = os.path.join(static_dir, "checkpoint")
        found[container_id] = (directory, _tree_bytes(directory) if os.path.isdir(directory) else 0)
    return found


def restore_group(label: str) -> None:
    """`gpuckpt restore --group LABEL`: every member back, their GPU state together."""
    process.run([_gpuckpt(), "restore", "--group", label], timeout_s=ENGINE_TIMEOUT_S)


def suspend(record: ContainerRecord) -> None:
    """`gpuckpt suspend`: the container's GPU state to host memory, its GPUs freed."""
    process.run([_gpuckpt(), "suspend", "--engine", record.engine, record.id], timeout_s=ENGINE_TIMEOUT_S)
