"""`gpuckpt-runtime create` (and `restore`) with hook.add_to_spec on: gpuckpt-hook added to the
spec of a container given an NVIDIA GPU, then the delegate's verb with the command line unchanged.

docker and containerd read no hooks.d (node/hooks_d.py); this puts their GPU containers in the
node's inventory too. A spec that already names the hook is left as it is; any other container's
spec is only read. Stdlib only: create is on every container's start-up path.
"""

from __future__ import annotations

import json
import os

from ..errors import ConfigError, GpuckptError
from ..hooks.main import MAX_SPEC_BYTES, gpu_minors, visible_devices
from ..host.safefiles import read_bounded, replace_file
from ..node.hook_entry import STAGES, spec_entry
from ..node.paths import config_path
from .argv import RuntimeArgs, parse_verb_args

# runc create's value-taking flags (create.go).
CREATE_VALUE_FLAGS = frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds"})


def add_hook(args: RuntimeArgs, hook: str, value_flags: frozenset[str] = CREATE_VALUE_FLAGS) -> bool:
    """Add the hook's entries to the bundle's config.json for a GPU container; whether the spec changed.
    Also before a restore (`value_flags`: restore's): containerd restores a task into a fresh bundle
    without `create`, and the container must be recorded again."""
    verb = parse_verb_args(args.command_args, value_flags)
    bundle = os.path.abspath(verb.value("bundle", "b") or ".")
    spec_path = os.path.join(bundle, "config.json")
    try:
        spec = json.loads(read_bounded(spec_path, MAX_SPEC_BYTES, spec_path))
    except ValueError as error:
        raise GpuckptError(f"{spec_path}: not JSON: {error}") from None
    if not isinstance(spec, dict) or not (gpu_minors(spec) or visible_devices(spec)):
        return False
    if not os.access(hook, os.X_OK):
        raise ConfigError(f"hook.add_to_spec is on in {config_path()} but {hook} is not an executable "
                          "(install gpuckpt-hook beside gpuckpt-runtime, or turn add_to_spec off)")
    hooks = spec.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise GpuckptError(f"{spec_path}: hooks is not an object")
    changed = False
    for stage in STAGES:
        entries = hooks.setdefault(stage, [])
        if not isinstance(entries, list):
            raise GpuckptError(f"{spec_path}: hooks.{stage} is not a list")
        if not any(isinstance(entry, dict) and entry.get("path") == hook for entry in entries):
            entries.append(spec_entry(hook, stage))
            changed = True
    if changed:
        replace_file(spec_path, json.dumps(spec), mode=os.stat(spec_path).st_mode & 0o777)
    return changed
