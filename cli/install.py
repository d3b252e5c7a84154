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
from ..node.config import load_config
from ..node.config_edit import turn_hook_on
from ..node.containerd import CONTAINERD_CONFIG, HANDLER, register_containerd
from ..node.hook_entry import hook_beside
from ..node.paths import config_path
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


def _stand_in(default: bool) -> str | None:
    """With --default, the delegate's own name (runc or crun): an archive naming it would otherwise reach
    it straight through podman's own `restore --import`, past every check the shim makes."""
    delegate = os.path.basename(load_config().delegate)
    return delegate if default and delegate in STAND_IN_NAMES else None


STAND_IN_NAMES = ("runc", "crun")  # the runtimes the shim delegates to, by podman's names for them


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


def run(options: argparse.Namespace) -> int:
    runtime_path = _runtime_path(options.runtime_path)
    if os.geteuid() == 0:  # a non-root run edits a --config of its own and signs nothing

        run_init(options)
    if options.engine == "containerd" and options.default:
        raise UsageError(f"--default: containerd's pods choose gpuckpt through a RuntimeClass whose handler is "
                         f"{HANDLER!r} (packaging/kubernetes/runtimeclass.yaml); give no --default")
    if options.engine == "podman":
        stand_in = _stand_in(options.default)
        change = engines.register_podman(runtime_path, default=options.default,
                                         conf_path=options.config or engines.PODMAN_CONF, hooks=not options.no_hook,
                                         stand_in_for=stand_in)
        if stand_in is not None and change.changed:
            print(f"podman's runtime {stand_in!r} now resolves to {runtime_path} too: a container or archive naming "
                  f"it goes through gpuckpt-runtime's checks, which runs {stand_in} as before")
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

