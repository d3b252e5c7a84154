"""Where an engine keeps a container's bundle: its layout names the engine. Stdlib only (the hook's start-up path)."""

from __future__ import annotations


def in_containers_storage(bundle: str) -> bool:
    """Whether `bundle` is a container's userdata directory in containers/storage's layout
    (GRAPHROOT/DRIVER-containers/ID/userdata), where podman keeps its bundles and makes their specs."""
    parts = bundle.split("/")
    return len(parts) > 3 and parts[-3].endswith("-containers") and parts[-1] == "userdata"


DEFAULT_RUN_ROOT = "/run/containers/storage"  # root's podman (containers-storage.conf runroot)

