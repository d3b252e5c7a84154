"""Edits of the node's config file that keep the operator's comments and other keys (`gpuckpt install`).

Apart from node/config.py, which only reads: tomlkit is for the editing CLI, not for the shim's path.
"""

from __future__ import annotations

import os

import tomlkit

from ..errors import ConfigError
from ..host.safefiles import replace_file
from .config import load_config, parse_config
from .paths import config_path


def turn_hook_on(path: str | None = None) -> bool:
    """Set `[hook] add_to_spec = true` in the config file, keeping its comments and other keys
    (the file is made if missing); whether it changed. Checked as load_config checks it, first."""
    path = path or config_path()
    load_config(path)  # a file we could not honour stays as it is
    try:
        with open(path, encoding="utf-8") as config_file:
            old_text = config_file.read()
    except FileNotFoundError:
        old_text = ""
    document = tomlkit.parse(old_text)
    section = document.setdefault("hook", tomlkit.table())
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: hook must be a table")
    section["add_to_spec"] = True
    new_text = tomlkit.dumps(document)
    if new_text == old_text:
        return False
    parse_config(new_text, path)
    mode = os.stat(path).st_mode & 0o777 if old_text else 0o644  # an operator's 0600 stays 0600
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o755, exist_ok=True)
    replace_file(path, new_text, mode=mode)
    return True
