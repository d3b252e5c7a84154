"""Finding a container on this node by name or ID: through podman, docker or runc state.

Only the container's init PID and ID are needed; its processes are that PID's tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GpuckptError, NotFoundError, UsageError
from ..host import process
from ..host.programs import find_program
from ..node.config import load_config
from ..node.paths import config_path
from ..shim.delegate import container_state
from ..shim.resolve import resolve_delegate

ENGINES = ("auto", "podman", "docker", "runc")


@dataclass(frozen=True)
class ContainerRef:
    engine: str
    container_id: str
    init_pid: int


def _inspect(engine_cli: str, name: str, engine: str) -> ContainerRef | None:
    program = find_program(engine_cli)
    if program is None:
        return None
    found = process.run([program, "inspect", "--format", "{{.State.Pid}} {{.Id}}", name], check=False, timeout_s=30)
    if found.returncode != 0:
        return None
    pid, container_id = found.stdout.split()[:2]
    return ContainerRef(engine, container_id, int(pid)) if int(pid) > 0 else None


def _runc(name: str, root: str | None) -> ContainerRef | None:
    delegate = resolve_delegate(load_config().delegate, config_path())
    try:
        state = container_state(delegate, ["--root", root] if root else [], name)
    except GpuckptError:
        return None
    return ContainerRef("runc", state.id, state.pid) if state.pid else None


def find_container(name: str, engine: str = "auto", root: str | None = None) -> ContainerRef:
    """The running container `name`, or a UsageError saying where it was looked for."""
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: allowed are {', '.join(ENGINES)}")
    lookups = {
        "runc": lambda: _runc(name, root),
        "podman": lambda: _inspect("podman", name, "podman"),
        "docker": lambda: _inspect("docker", name, "docker"),
    }
    order = [engine] if engine != "auto" else (["runc"] if root else []) + ["podman", "docker", "runc"]
    for each in dict.fromkeys(order):
        found = lookups[each]()
        if found is not None:
            return found
    raise NotFoundError(f"no running container {name!r} found through {', '.join(dict.fromkeys(order))}")
