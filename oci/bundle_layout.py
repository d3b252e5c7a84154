"""Where an engine keeps a container's bundle: its layout names the engine. Stdlib only (the hook's start-up path)."""

from __future__ import annotations


def in_containers_storage(bundle: str) -> bool:
    """Whether `bundle` is a container's userdata directory in containers/storage's layout
    (GRAPHROOT/DRIVER-containers/ID/userdata), where podman keeps its bundles and makes their specs."""
    parts = bundle.split("/")
    return len(parts) > 3 and parts[-3].endswith("-containers") and parts[-1] == "userdata"


DEFAULT_RUN_ROOT = "/run/containers/storage"  # root's podman (containers-storage.conf runroot)


def storage_roots(bundle: str) -> tuple[str, ...]:
    """Where podman keeps a container's own files (its /etc/hosts, /dev/shm, secrets) for a bundle in
    containers/storage: the graph root the bundle is in, and root's run root; () for any other bundle."""
    if not in_containers_storage(bundle):
        return ()
    return bundle.rstrip("/").rsplit("/", 3)[0], DEFAULT_RUN_ROOT
