"""CRIU's own CUDA plugin, which must not handle the GPU when the shim does.

CRIU >= 4 loads every plugin in its plugin directory (CRIU_LIBS_DIR, else
/usr/lib/criu/); its cuda_plugin.so drives NVIDIA's cuda-checkpoint tool. For a
dump the shim handles, CRIU is pointed at a directory with every plugin but that one.
"""

from __future__ import annotations

import os
from typing import Literal

from ..node.paths import state_dir

CRIU_DEFAULT_PLUGIN_DIR = "/usr/lib/criu"
CUDA_PLUGIN = "cuda_plugin.so"


def criu_plugin_dir() -> str:
    return os.environ.get("CRIU_LIBS_DIR") or CRIU_DEFAULT_PLUGIN_DIR


def criu_cuda_plugin() -> str | None:
    """The CUDA plugin CRIU would load, if there is one."""
    path = os.path.join(criu_plugin_dir(), CUDA_PLUGIN)
    return path if os.path.exists(path) else None


def disable_criu_plugins() -> str:
    """Point CRIU (through the delegate's environment) at the plugins minus CUDA's; the new dir."""
    source = criu_plugin_dir()
    target = os.path.join(state_dir(), "criu-plugins")
    os.makedirs(target, mode=0o700, exist_ok=True)
    wanted = {name for name in os.listdir(source) if name.endswith(".so") and name != CUDA_PLUGIN}
    for name in set(os.listdir(target)) - wanted:
        os.unlink(os.path.join(target, name))
    for name in wanted - set(os.listdir(target)):
        os.symlink(os.path.join(source, name), os.path.join(target, name))
    os.environ["CRIU_LIBS_DIR"] = target
    return target


def gpu_handler(has_cuda_processes: bool) -> Literal["gpuckpt", "none"]:
    return "gpuckpt" if has_cuda_processes else "none"
