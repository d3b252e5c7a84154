"""The NVIDIA device nodes a spec names: /dev/nvidiaN is the GPU with minor number N.

Stdlib only: gpuckpt-hook reads it on every container start.
"""

from __future__ import annotations

import re

NVIDIA_DEVICE = re.compile(r"/dev/nvidia([0-9]{1,3})", re.ASCII)  # fullmatch: no other digits, no newline
NVIDIA_DEVICE_PREFIX = "/dev/nvidia"  # nvidiactl, nvidia-uvm, nvidia0..N: any means the driver is held


def gpu_minor(path: str) -> int | None:
    """N for /dev/nvidiaN; None for any other path (nvidiactl, nvidia-uvm, ...)."""
    match = NVIDIA_DEVICE.fullmatch(path)
    return int(match.group(1)) if match else None
