"""The engines' own config files, as far as gpuckpt edits them.

podman's containers.conf (TOML, edited with tomlkit so comments and the user's
other settings survive) and docker's daemon.json. Every edit is idempotent and
backs the file up once before its first change.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import tomllib

import tomlkit
from pydantic import BaseModel, ConfigDict, ValidationError
from tomlkit.exceptions import TOMLKitError

from ..errors import EngineConfigError
from ..host.programs import find_program
from ..host.safefiles import replace_file
from .hook_entry import hook_beside
from .hooks_d import PACKAGED_HOOK_PATH, PACKAGED_HOOKS_DIR, hooks_d_files

RUNTIME_NAME = "gpuckpt-runtime"
PODMAN_CONF = "/etc/containers/containers.conf"
DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"
# Read by podman and CRI-O besides /usr/share/containers/oci/hooks.d (the packages' place); a
# file here replaces the packaged one of the same name.
PODMAN_HOOKS_DIR = "/etc/containers/oci/hooks.d"
# containers/common's default list of runtimes that take --log-format=json; a
# configured list replaces it, so ours carries the defaults along.
PODMAN_JSON_RUNTIMES = ["crun", "runc", "kata", "runsc", "youki", "krun"]
# The runtime names podman knows by default (containers/common's [engine.runtimes]) that it would run as an
# archive's config.dump names them, under its own `restore --import`
PODMAN_RUNTIME_NAMES = ("runc", "crun", "crun-vm", "crun-wasm", "kata", "runsc", "youki", "krun", "ocijail", "runj")
# Beside containers.conf: the links to gpuckpt-runtime named after the runtimes it stands in for (podman runs a
# runtime with its table's path as argv[0], and the shim delegates by that name)
STAND_IN_DIR = "gpuckpt-runtime.as"


class DockerRuntime(BaseModel):
    """One entry of daemon.json's `runtimes`."""

    model_config = ConfigDict(extra="allow")
    path: str
    runtimeArgs: list[str] = []


def _write_with_backup(path: str, old_text: str | None, new_text: str) -> str | None:
    """Replace `path` atomically; the backup's path when there was a file to keep."""
    backup = None
    if old_text is not None:
        backup = f"{path}.gpuckpt-backup-{time.strftime('%Y%m%d%H%M%S')}"
        shutil.copy2(path, backup)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.gpuckpt-tmp"
    with open(temporary, "w", encoding="utf-8") as new_file:
        new_file.write(new_text)
    if old_text is not None:
        shutil.copymode(path, temporary)
    os.replace(temporary, path)
    return backup


def read_engine_file(path: str) -> str | None:
    """The text of an engine's file; None if there is none."""
    try:
        with open(path, encoding="utf-8") as existing:
            return existing.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise EngineConfigError(f"{path}: cannot read: {error.strerror}") from None
    except UnicodeDecodeError:
        raise EngineConfigError(f"{path}: not UTF-8 text") from None


class Change:
    """What an edit did: whether the file changed and where the backup went."""

    def __init__(self, path: str, changed: bool, backup: str | None) -> None:
        self.path, self.changed, self.backup = path, changed, backup


def stand_in_links(runtime_path: str, names: list[str], conf_path: str = PODMAN_CONF) -> dict[str, str]:
    """A link to `runtime_path` named after each of `names`, in STAND_IN_DIR beside `conf_path` (root's, 0755,
    as /etc/containers is); each name -> its link."""
    directory = os.path.join(os.path.dirname(os.path.abspath(conf_path)), STAND_IN_DIR)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    links = {}
    for name in names:
        link = os.path.join(directory, name)
        if os.path.islink(link) and os.readlink(link) == runtime_path:
            links[name] = link
            continue
        temporary = f"{link}.gpuckpt-tmp"
        if os.path.lexists(temporary):
            os.unlink(temporary)
        os.symlink(runtime_path, temporary)
        os.replace(temporary, link)
        links[name] = link
    return links


def stands_in(paths: list[str], runtime_path: str) -> bool:
    """Whether a podman runtime of these paths runs `runtime_path`: podman takes the first that is a file (where
    none is, the first named here)."""
    chosen = next((path for path in paths if os.path.isfile(path)), paths[0] if paths else None)
    return chosen is not None and os.path.realpath(chosen) == os.path.realpath(runtime_path)


def register_podman(runtime_path: str, *, default: bool, conf_path: str = PODMAN_CONF, hooks: bool = False,
                    stand_in_for: dict[str, str] | None = None) -> Change:
    """Add `[engine.runtimes] gpuckpt-runtime = [PATH]` (and make it the default; with `hooks`, have
    podman read PODMAN_HOOKS_DIR too: a podman without containers-common reads only its built-in
    /usr/share/containers/oci/hooks.d). `stand_in_for`: podman runtime names (runc, crun) -> the link to PATH
    named after each (stand_in_links): a container or archive that names one (podman's own `restore
    --import`) goes through the shim, which runs the runtime of that name as before."""
    old_text = read_engine_file(conf_path)
    try:
        document = tomlkit.parse(old_text or "")
    except TOMLKitError as error:
        raise EngineConfigError(f"{conf_path}: not valid TOML: {error}") from None
    engine = document.setdefault("engine", tomlkit.table())
    runtimes = engine.setdefault("runtimes", tomlkit.table())
    if not isinstance(engine, dict) or not isinstance(runtimes, dict):
        raise EngineConfigError(f"{conf_path}: [engine] and [engine.runtimes] must be tables")
    runtimes[RUNTIME_NAME] = [runtime_path]
    for name, link in (stand_in_for or {}).items():
        runtimes[name] = [link]
    json_runtimes = list(engine.get("runtime_supports_json", PODMAN_JSON_RUNTIMES))
    if RUNTIME_NAME not in json_runtimes:
        engine["runtime_supports_json"] = [*json_runtimes, RUNTIME_NAME]
    if default:
        engine["runtime"] = RUNTIME_NAME
    if hooks:
        hooks_dirs = list(engine.get("hooks_dir", [PACKAGED_HOOKS_DIR]))
        if PODMAN_HOOKS_DIR not in hooks_dirs:
            engine["hooks_dir"] = [*hooks_dirs, PODMAN_HOOKS_DIR]
    new_text = tomlkit.dumps(document)
    if new_text == old_text:
        return Change(conf_path, False, None)
    return Change(conf_path, True, _write_with_backup(conf_path, old_text, new_text))


def register_docker(runtime_path: str, *, default: bool, daemon_json: str = DOCKER_DAEMON_JSON) -> Change:
    """Add `runtimes.gpuckpt-runtime.path` to daemon.json (and `default-runtime`)."""
    old_text = read_engine_file(daemon_json)
    try:
        settings = json.loads(old_text) if old_text and old_text.strip() else {}
    except ValueError as error:
        raise EngineConfigError(f"{daemon_json}: not valid JSON: {error}") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("runtimes", {}), dict):
        raise EngineConfigError(f"{daemon_json}: must be a JSON object whose 'runtimes' is an object")
    runtimes = settings.setdefault("runtimes", {})
    try:
        entry = DockerRuntime.model_validate(runtimes.get(RUNTIME_NAME, {"path": runtime_path}))
    except ValidationError as error:
        raise EngineConfigError(f"{daemon_json}: runtimes.{RUNTIME_NAME}: {error.errors()[0]['msg']}") from None
    entry.path = runtime_path
    runtimes[RUNTIME_NAME] = entry.model_dump(exclude_defaults=True) | {"path": runtime_path}
    # `docker checkpoint` is an experimental feature of dockerd.
    settings["experimental"] = True
    if default:
        settings["default-runtime"] = RUNTIME_NAME
    new_text = json.dumps(settings, indent=2) + "\n"
    if old_text is not None and json.loads(old_text or "{}") == settings:
        return Change(daemon_json, False, None)
    return Change(daemon_json, True, _write_with_backup(daemon_json, old_text, new_text))


def podman_registration(conf_path: str = PODMAN_CONF) -> tuple[list[str] | None, bool]:
    """The registered runtime's path list (None if absent) and whether it is the default."""
    text = read_engine_file(conf_path)
    if text is None:
        return None, False

    try:
        engine = tomllib.loads(text).get("engine", {})
    except tomllib.TOMLDecodeError as error:
        raise EngineConfigError(f"{conf_path}: not valid TOML: {error}") from None
    return engine.get("runtimes", {}).get(RUNTIME_NAME), engine.get("runtime") == RUNTIME_NAME


def podman_runtimes(conf_path: str = PODMAN_CONF) -> dict[str, list[str]]:
    """containers.conf's `[engine.runtimes]` table as this file has it (podman's built-in one is not read)."""
    text = read_engine_file(conf_path)
    if text is None:
        return {}
    try:
        runtimes = tomllib.loads(text).get("engine", {}).get("runtimes", {})
    except tomllib.TOMLDecodeError as error:
        raise EngineConfigError(f"{conf_path}: not valid TOML: {error}") from None
    return {str(name): list(paths) for name, paths in runtimes.items() if isinstance(paths, list)}


def docker_registration(daemon_json: str = DOCKER_DAEMON_JSON) -> tuple[str | None, bool]:
    """The registered runtime's path (None if absent) and whether it is the default."""
    text = read_engine_file(daemon_json)
    if not text or not text.strip():
        return None, False
    try:
        settings = json.loads(text)
    except ValueError as error:
        raise EngineConfigError(f"{daemon_json}: not valid JSON: {error}") from None
    entry = settings.get("runtimes", {}).get(RUNTIME_NAME) or {}
    return entry.get("path"), settings.get("default-runtime") == RUNTIME_NAME


def install_hooks_d(hook_path: str, hooks_dir: str = PODMAN_HOOKS_DIR) -> Change:
    """gpuckpt-hook's hooks.d files (node/hooks_d.py) for the hook at `hook_path`, in `hooks_dir`."""
    changed = False
    for name, text in hooks_d_files(hook_path).items():
        path = os.path.join(hooks_dir, name)
        if read_engine_file(path) != text:
            os.makedirs(hooks_dir, mode=0o755, exist_ok=True)
            replace_file(path, text, mode=0o644)
            changed = True
    return Change(hooks_dir, changed, None)


def own_hook_paths() -> frozenset[str]:
    """Where this node's gpuckpt-hook is (beside gpuckpt-runtime, as `gpuckpt install` names it,
    or where the packages put it): the hook entries an engine wrote into a spec may name these."""
    runtime = find_program(RUNTIME_NAME)
    beside = {hook_beside(path) for path in (runtime, os.path.realpath(runtime))} if runtime else set()
    return frozenset(path for path in {*beside, PACKAGED_HOOK_PATH} if os.access(path, os.X_OK))
