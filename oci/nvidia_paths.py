"""The NVIDIA paths gpuckpt reads meaning into: /dev/nvidiaN is the GPU with minor number N; a driver library
carries its driver's version in its name (libcuda.so.580.159.04).

Stdlib only: gpuckpt-hook reads it on every container start.
"""

from __future__ import annotations

import re

NVIDIA_DEVICE = re.compile(r"/dev/nvidia([0-9]{1,3})", re.ASCII)  # fullmatch: no other digits, no newline
NVIDIA_DEVICE_PREFIX = "/dev/nvidia"  # nvidiactl, nvidia-uvm, nvidia0..N: any means the driver is held
# A driver library as nvidia-ctk's spec mounts it (pkg/nvcdi/driver-nvml.go: every `*.so.<driver version>`):
# libcuda.so.580.159.04, libnvidia-ml.so.580.159.04, libEGL_nvidia.so.560.35.03. A driver version has a
# three-digit branch; the CUDA runtime's libraries (libcudart.so.12.4.127) have two, and are the image's own.
DRIVER_LIBRARY = re.compile(r"(?:libcuda|libcudadebugger|libnvcuvid|libnvoptix|lib[A-Za-z0-9_-]*nvidia[A-Za-z0-9_-]*)"
                            r"\.so\.([0-9]{3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?)", re.ASCII)


def gpu_minor(path: str) -> int | None:
    """N for /dev/nvidiaN; None for any other path (nvidiactl, nvidia-uvm, ...)."""
    match = NVIDIA_DEVICE.fullmatch(path)
    return int(match.group(1)) if match else None


def driver_file_version(path: str) -> str | None:
    """The driver version in a driver library's name ("580.159.04" for .../libcuda.so.580.159.04); None for any
    other path."""
    match = DRIVER_LIBRARY.fullmatch(path.rsplit("/", 1)[-1])
    return match.group(1) if match else None
