"""`gpuckpt install --engine podman|docker|containerd`: register gpuckpt-runtime with an engine.

Makes this node's signing key if it has none (node.trust: root only, never replaced), then
edits the engine's own config idempotently (backup first, other settings kept) and, for a
running dockerd, asks it to reload its runtimes.
"""

from __future__ import annotations

import argparse
import os
import signal

from ..errors import UsageError
from ..host.programs import find_program
from ..node import engines
from ..node.config_edit import turn_hook_on
from ..node.containerd import CONTAINERD_CONFIG, HANDLER, register_containerd
from ..node.hook_entry import hook_beside
from ..node.paths import config_path
from ..shim.resolve import DELEGATE_NAMES
from .trust import run_init

DOCKER_PID_FILE = "/var/run/docker.pid"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("install", help="register gpuckpt-runtime with podman, docker or containerd")
    parser.add_argument("--engine", required=True, choices=["podman", "docker", "containerd"])
    parser.add_argument("--default", action="store_true", help="make gpuckpt-runtime the engine's default runtime")
    parser.add_argument("--runtime-path", help="path of gpuckpt-runtime (default: found on PATH)")
    parser.add_argument("--config", help="the engine config file to edit (default: the engine's system file)")
    parser.add_argument("--no-hook", action="store_true",
                        help="leave gpuckpt-hook out (podman: no hooks.d file; docker: hook.add_to_spec not turned on)")
    parser.set_defaults(handler=run)


def _runtime_path(given: str | None) -> str:
    path = given or find_program(engines.RUNTIME_NAME)
    if not path or not os.path.isabs(path) or not os.access(path, os.X_OK):
        raise UsageError(f"--runtime-path: {path or engines.RUNTIME_NAME + ' on PATH'} is not an executable absolute "
                         "path")
    return path


def _reload_dockerd() -> str:
    """SIGHUP makes dockerd re-read `runtimes` and `default-runtime`."""
    try:
        with open(DOCKER_PID_FILE) as pid_file:
            pid = int(pid_file.read().strip())
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return "dockerd is not running: it reads the runtime when it starts"
    return f"dockerd (pid {pid}) reloaded its runtimes"


def _stand_ins(default: bool, runtime_path: str, conf_path: str) -> tuple[list[str], list[str]]:
    """With --default, the runtimes podman knows that this node has: those gpuckpt-runtime delegates to (runc,
    crun: it runs the one of the name it is called under) and the others, left as they are (their containers
    would lose their runtime). Without, nothing: an archive naming one would otherwise reach it straight
    through podman's own `restore --import`, past every check the shim makes."""
    if not default:
        return [], []
    own, table = os.path.realpath(runtime_path), engines.podman_runtimes(conf_path)

    def installed(name: str) -> bool:
        if find_program(name, skip=own):  # how the shim finds the runtime it stands in for
            return True
        return name not in DELEGATE_NAMES and any(os.path.isfile(path) and os.path.realpath(path) != own
                                                  for path in table.get(name, []))

    present = [name for name in engines.PODMAN_RUNTIME_NAMES if installed(name)]
    return [name for name in present if name in DELEGATE_NAMES], [name for name in present
                                                                    if name not in DELEGATE_NAMES]


def _install_hook(engine: str, runtime_path: str) -> str:
    """gpuckpt-hook for this engine's containers: podman reads hooks.d, docker and containerd get it from the runtime's
    create."""
    hook_path = hook_beside(runtime_path)
    if not os.access(hook_path, os.X_OK):
        raise UsageError(f"gpuckpt-hook is not beside {runtime_path} (reinstall gpuckpt, or pass --no-hook)")
    if engine == "podman":
        change = engines.install_hooks_d(hook_path)
        return f"{change.path}: gpuckpt-hook {'registered' if change.changed else 'already registered'} ({hook_path})"
    changed = turn_hook_on()
    return f"{config_path()}: hook.add_to_spec {'turned on' if changed else 'already on'} ({hook_path})"


def _register_podman(runtime_path: str, options: argparse.Namespace) -> engines.Change:
    """containers.conf, and with --default the links that make podman's runc and crun the shim."""
    conf_path = options.config or engines.PODMAN_CONF
    names, others = _stand_ins(options.default, runtime_path, conf_path)
    links = engines.stand_in_links(runtime_path, names, conf_path) if names else {}
    change = engines.register_podman(runtime_path, default=options.default, conf_path=conf_path,
                                     hooks=not options.no_hook, stand_in_for=links)
    if links:
        print(f"podman's runtimes {', '.join(links)} now run {runtime_path} (links named after them in "
              f"{os.path.dirname(next(iter(links.values())))}): a container or archive naming one goes through "
              "gpuckpt-runtime's checks, which runs that runtime as before")
    if others:
        print(f"podman's runtimes {', '.join(others)} are left as they are (gpuckpt-runtime delegates to "
              f"{' and '.join(DELEGATE_NAMES)} only): podman's own `restore --import` of an archive naming one "
              "runs it past gpuckpt's checks; restore archives from elsewhere with `gpuckpt import`")
    return change


def run(options: argparse.Namespace) -> int:
    runtime_path = _runtime_path(options.runtime_path)
    if os.geteuid() == 0:  # a non-root run edits a --config of its own and signs nothing

        run_init(options)
    if options.engine == "containerd" and options.default:
        raise UsageError(f"--default: containerd's pods choose gpuckpt through a RuntimeClass whose handler is "
                         f"{HANDLER!r} (packaging/kubernetes/runtimeclass.yaml); give no --default")
    if options.engine == "podman":
        change = _register_podman(runtime_path, options)
    elif options.engine == "containerd":
        change = register_containerd(runtime_path, config_path=options.config or CONTAINERD_CONFIG)
    else:
        change = engines.register_docker(runtime_path, default=options.default,
                                         daemon_json=options.config or engines.DOCKER_DAEMON_JSON)
    if not options.no_hook and not options.config and os.geteuid() == 0:
        print(_install_hook(options.engine, runtime_path))
    if not change.changed:
        print(f"{change.path}: {engines.RUNTIME_NAME} already registered ({runtime_path}); nothing changed")
        return 0
    backup = f" (backup: {change.backup})" if change.backup else ""
    if options.engine == "containerd":
        print(f"{change.path}: registered the CRI runtime handler {HANDLER!r} -> {runtime_path}{backup}; "
              "restart containerd (it reads its config when it starts)")
        return 0
    print(f"{change.path}: registered {engines.RUNTIME_NAME} -> {runtime_path}{backup}")
    if options.engine == "docker" and not options.config:
        print(_reload_dockerd())
    return 0

