"""The shim's own CRIU configuration file, for options runc has no flag for.

CRIU reads the file named by CRIU_CONFIG_FILE, and the delegate's CRIU inherits
the variable. The file lives in the shim's root-only state directory and is named
by its content, so concurrent checkpoints never rewrite each other's.
"""

from __future__ import annotations

import hashlib
import os

from ..errors import CheckpointRefusedError
from ..host.processes import Processes
from ..host.safefiles import replace_file
from ..node.paths import config_path, state_dir

CRIU_DEFAULT_GHOST_LIMIT = 1 << 20
SHM_DIR = "/dev/shm/"


def ghost_limit_of(setting: str | int, processes: Processes, max_bytes: int) -> tuple[int, str]:
    """The ghost-limit to give CRIU (0: leave its default) and why, from the setting and the
    container's deleted-but-held files; "auto" refuses a file above `max_bytes` (criu.max_ghost_bytes)."""
    if setting != "auto":
        return int(setting), "set by criu.ghost_limit"
    ghosts = processes.deleted_file_sizes()
    if not ghosts or max(ghosts.values()) <= CRIU_DEFAULT_GHOST_LIMIT:
        return 0, ""
    path, size = max(ghosts.items(), key=lambda item: item[1])
    if size > max_bytes:
        raise CheckpointRefusedError(
            f"{path[:200]!r} is deleted but still held, {size} bytes ({size >> 20} MiB), above criu.max_ghost_bytes "
            f"({max_bytes} bytes) in {config_path()}: CRIU would copy it whole into the image (raise the key to "
            "allow it)")
    limit = -(-size // (1 << 20)) << 20  # whole MiB, at least the largest file
    return limit, f"{len(ghosts)} deleted file(s) still held, the largest {path} of {size >> 20} MiB"


def link_remap_files(processes: Processes) -> set[str]:
    """Files directly in /dev/shm held under a removed name while still linked (POSIX named
    semaphores), which CRIU dumps only with link-remap. Only there: CRIU makes its temporary
    link beside the file, which in /dev/shm is the container's own tmpfs."""
    return {path for path in processes.deleted_but_linked()
            if path.startswith(SHM_DIR) and "/" not in path.removeprefix(SHM_DIR)}


def use_criu_config(lines: list[str]) -> str:
    """Write `lines` as a CRIU config file and point CRIU_CONFIG_FILE at it; returns its path."""
    text = "".join(f"{line}\n" for line in lines)
    os.makedirs(state_dir(), mode=0o700, exist_ok=True)
    path = os.path.join(state_dir(), f"criu-{hashlib.sha256(text.encode()).hexdigest()[:16]}.conf")
    if not os.path.exists(path):
        replace_file(path, text)
    os.environ["CRIU_CONFIG_FILE"] = path
    return path


def network_lock_lines(method: str) -> list[str]:
    return [] if method == "iptables" else [f"network-lock {method}"]  # iptables: CRIU's default
