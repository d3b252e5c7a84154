"""The node's GPUs as the NVIDIA driver lists them in /proc/driver/nvidia/gpus: minor number -> UUID.

Stdlib only and no NVML: gpuckpt-hook asks on every GPU container start, and NVML's
initialisation costs more than the hook may (docs/speed.md: hook cost). GPUCKPT_NVIDIA_PROC moves the
directory, for tests on machines with no GPU.
"""

from __future__ import annotations

import os

DEFAULT_NVIDIA_PROC = "/proc/driver/nvidia"
NVIDIA_PROC_ENV = "GPUCKPT_NVIDIA_PROC"
MAX_INFORMATION_BYTES = 16 << 10


def nvidia_proc() -> str:
    return os.environ.get(NVIDIA_PROC_ENV) or DEFAULT_NVIDIA_PROC


def _fields(text: str) -> dict[str, str]:
    """`Key:   value` lines of a GPU's `information` file."""
    fields = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields[key.strip()] = value.strip()
    return fields


def gpu_uuids_by_minor() -> dict[int, str] | None:
    """Each GPU's UUID by its minor number (/dev/nvidiaN); None when the driver is not loaded here."""
    gpus_dir = os.path.join(nvidia_proc(), "gpus")
    try:
        buses = os.listdir(gpus_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    found = {}
    for bus in buses:
        try:
            with open(os.path.join(gpus_dir, bus, "information"), "rb") as information:
                fields = _fields(information.read(MAX_INFORMATION_BYTES).decode("utf-8", "replace"))
        except OSError:
            continue  # a GPU going away meanwhile is not on this node
        minor, uuid = fields.get("Device Minor", ""), fields.get("GPU UUID", "")
        if minor.isdigit() and uuid.startswith("GPU-"):
            found[int(minor)] = uuid
    return found
