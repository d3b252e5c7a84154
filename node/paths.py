"""Where gpuckpt's node files live; light enough for the shim's start-up path.

Each location can be moved by an environment variable, for tests and packagers.
"""

from __future__ import annotations

import os

DEFAULT_CONFIG_PATH = "/etc/gpuckpt/config.toml"
CONFIG_PATH_ENV = "GPUCKPT_CONFIG"
DEFAULT_STATE_DIR = "/run/gpuckpt"
STATE_DIR_ENV = "GPUCKPT_STATE_DIR"


def config_path() -> str:
    return os.environ.get(CONFIG_PATH_ENV) or DEFAULT_CONFIG_PATH


def state_dir() -> str:
    """Root-only runtime state (caches, suspend records); on tmpfs, gone at reboot."""
    return os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR


DEV_DIR_ENV = "GPUCKPT_DEV_DIR"


def dev_dir() -> str:
    """The node's /dev, whose nvidia* say which devices are this node's GPUs; tests give a directory of their own."""
    return os.environ.get(DEV_DIR_ENV) or "/dev"


THP_ENABLED_PATH = "/sys/kernel/mm/transparent_hugepage/enabled"
THP_ENABLED_ENV = "GPUCKPT_THP_ENABLED"


def thp_enabled_path() -> str:
    """The node's transparent hugepage switch (cuda/hugepages.py); tests give a file of their own."""
    return os.environ.get(THP_ENABLED_ENV) or THP_ENABLED_PATH
