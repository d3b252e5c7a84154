"""The NVIDIA driver a checkpoint's processes run, and whether a restore gives them that driver again.

At a checkpoint: the driver libraries the processes map (/proc, read once: host/processes.py), each with the host
file the container's config bind-mounted there. At a restore, before the delegate runs: refused, in one line
naming both versions, where the node's loaded driver is another version or the restore's config does not bring
each bind-mounted file again from an existing host file. A CUDA process keeps the user-mode driver it was
checkpointed with in its memory, and the kernel module talks to clients of its own version only (docs/cdi.md).
"""

from __future__ import annotations

import os
from collections import Counter

from ..host.processes import Processes
from ..oci.manifest import DriverFileRecord, Manifest
from ..oci.nvidia_paths import driver_file_version
from ..oci.spec import Mount, Spec

MAX_DRIVER_FILES = 4096  # the manifest's bound on lists


def driver_files_of(processes: Processes, spec: Spec) -> list[DriverFileRecord]:
    """Each driver library any of `processes` maps, once, with the host file `spec` bind-mounts there."""
    paths = sorted({path for process in processes for path in process.mappings if driver_file_version(path)})
    return [DriverFileRecord(path=path, version=driver_file_version(path) or "",
                             host_path=mount.source if (mount := _mount_of(path, spec)) else "")
            for path in paths[:MAX_DRIVER_FILES]]


def _mount_of(path: str, spec: Spec) -> Mount | None:
    """The config's bind mount of the driver file a process maps at `path`: at that destination, else of that name.
    runc mounts a destination through the image's links (/lib -> usr/lib), and the mapping shows where it landed;
    a driver file's name holds its version, so the name alone is one driver's file."""
    binds = [mount for mount in spec.mounts if mount.is_bind()]
    name = os.path.basename(path)
    return (next((mount for mount in reversed(binds) if mount.destination == path), None)
            or next((mount for mount in reversed(binds) if os.path.basename(mount.destination) == name), None))


def checkpoint_driver(manifest: Manifest) -> str:
    """The driver the checkpoint's processes ran: the kernel module's as NVML said, else what the files they map
    from the host say (the most of them)."""
    mounted = Counter(record.version for record in manifest.driver_files if record.host_path)
    return manifest.driver_version or (mounted.most_common(1)[0][0] if mounted else "")


def spec_driver_versions(spec: Spec) -> list[str]:
    """The driver versions of the libraries a container config mounts (a CDI spec's edits, applied)."""
    return sorted({version for mount in spec.mounts if (version := driver_file_version(mount.destination))})


def _not_brought(record: DriverFileRecord, spec: Spec) -> str | None:
    """Why the restore's config does not give `record`'s path a host file again; None if it does."""
    mount = _mount_of(record.path, spec)
    if mount is None:
        return f"the restore's config mounts nothing at {record.path}"
    if not os.path.isfile(mount.source):
        return f"{record.path} is mounted from {mount.source}, which this node does not have"
    if driver_file_version(mount.source) not in (None, record.version):
        return f"{record.path} is mounted from {mount.source}, another driver's file"
    return None


def driver_change_refusal(manifest: Manifest, spec: Spec | None, node_driver: str | None) -> str | None:
    """One line refusing the restore of `manifest`'s processes under `spec` (None: unreadable, the delegate's
    to refuse) on a node whose loaded driver is `node_driver` (None: not asked, the processes hold no GPU state);
    None where nothing differs or the manifest records no driver files (a gpuckpt before the record)."""
    if not manifest.driver_files:
        return None
    old = checkpoint_driver(manifest)
    example = next((r.path for r in manifest.driver_files if r.path.rsplit("/", 1)[-1].startswith("libcuda.so")),
                   manifest.driver_files[0].path)
    missing = [why for record in manifest.driver_files if record.host_path and spec is not None
               and (why := _not_brought(record, spec))]
    other_version = node_driver is not None and old not in ("", node_driver)
    if not missing and not other_version:
        return None
    brought = spec_driver_versions(spec) if spec is not None else []
    if other_version:
        here = f"this node runs driver {node_driver or 'none'}"
    elif brought and old not in brought:
        here = f"this restore's config brings driver {', '.join(brought)}'s files ({missing[0]})"
    else:
        more = f", and {len(missing) - 1} more" if missing[1:] else ""
        here = f"this restore does not bring them ({missing[0]}{more})"
    return (f"restore of {manifest.container_id} refused: its processes run NVIDIA driver {old or 'unknown'} "
            f"(they map {example}), {here}; a process keeps the driver it was checkpointed with: restore it on a "
            f"node with driver {old or 'of the checkpoint'} (its files at the same paths), or install that driver "
            f"here (docs/cdi.md)")
