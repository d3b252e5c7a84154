"""`gpuckpt inspect ARCHIVE|IMAGE|DIR`: what a checkpoint holds, as text or --json, from the same data.

Container and engine (podman's config.dump), GPUs, CUDA processes, network policy, CRIU
options, timings and sizes; an archive or image layer is read once, checked, never unpacked.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..errors import NotFoundError
from ..host import process
from ..host.programs import find_program
from ..host.safefiles import read_bounded
from ..node.container_record import container_label, short_id
from ..oci.image_layout import is_layout, parse_target, read_layout, verify_layer
from ..oci.manifest import read_manifest
from ..oci.podman_archive import CONFIG_DUMP, SMALL_FILES, PodmanArchive, check_podman_archive, described
from .output import Inspected, counted, size_text


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("inspect", help="show what a checkpoint archive, image or directory holds")
    parser.add_argument("path", help="a checkpoint archive (.tar.zst, .tar.gz, .tar: podman's or gpuckpt "
                                     "export's), an OCI image layout (DIR or oci:DIR[:TAG]), a checkpoint "
                                     "image in podman's storage (NAME or containers-storage:NAME), or a "
                                     "checkpoint directory")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run)


def _podman_summary(archive: PodmanArchive, kind: str) -> dict[str, Any]:
    """podman's layout; containerd's CRI checkpoint writes it too, naming its runtime io.containerd.*"""
    config = archive.config
    engine = "containerd" if config.runtime.startswith("io.containerd.") else "podman"
    return {"kind": kind, "engine": engine,
            "container": {"name": config.name, "id": config.id, "image": config.rootfsImageName,
                          "runtime": config.runtime, "created": config.createdTime},
            "manifest": archive.manifest.model_dump() if archive.manifest else None}


def _directory_summary(path: str, kind: str) -> dict[str, Any]:
    """A checkpoint directory: the shim's image directory, or podman's layout unpacked (a mounted
    checkpoint image); files are read without following links."""
    names, sizes, kept = [], [], {}
    for directory, _subdirectories, files in os.walk(path):
        for name in files:
            full = os.path.join(directory, name)
            relative = os.path.relpath(full, path)
            names.append(relative)
            sizes.append(os.lstat(full).st_size)
            if relative in SMALL_FILES:
                kept[relative] = read_bounded(full, SMALL_FILES[relative], full)
    summary = {"path": path, "files": len(sizes), "bytes": sum(sizes), "stored_bytes": sum(sizes)}
    if CONFIG_DUMP in kept:
        return summary | _podman_summary(described(path, kept, names, len(sizes), sum(sizes)), kind)
    manifest = read_manifest(path)
    return summary | {"kind": "directory", "engine": None, "container": None,
                      "manifest": manifest.model_dump() if manifest else None}


def _storage_image_summary(name: str) -> dict[str, Any] | None:
    """A checkpoint image in podman's local storage (`podman container checkpoint --create-image`,
    or pulled): mounted read-only by podman for the reading, unmounted after. None: no such image."""
    podman = find_program("podman")
    if podman is None or process.run([podman, "image", "exists", name], check=False).returncode != 0:
        return None
    annotations = json.loads(
        process.run([podman, "image", "inspect", "--format", "{{json .Annotations}}", name]).stdout or "{}"
    )
    mount_point = process.run([podman, "image", "mount", name]).stdout.strip()
    try:
        summary = _directory_summary(mount_point, "podman-image")
    finally:
        process.run([podman, "image", "unmount", name], check=False)
    return summary | {"path": name, "image": {"tag": name, "layer_digest": "", "layer_media_type": "containers-storage",
                                              "annotations": annotations or {}}}


def _archive_summary(path: str) -> dict[str, Any]:
    """What an archive holds, read once without unpacking (podman's layout: podman and `gpuckpt export` write it)."""
    archive = check_podman_archive(path)
    summary = {"path": path, "files": archive.files, "bytes": archive.bytes, "stored_bytes": os.path.getsize(path)}
    return summary | _podman_summary(archive, "podman-archive")


def _summary(path: str) -> dict[str, Any]:
    target = parse_target(path)
    if target is not None or is_layout(path):
        directory, tag = target if target is not None else (path, None)
        image = read_layout(directory, tag)
        verify_layer(image)
        summary = _archive_summary(image.layer_path)
        return summary | {"path": path, "kind": "oci-image",
                          "image": {"tag": image.tag, "layer_digest": image.layer.digest,
                                    "layer_media_type": image.layer.mediaType,
                                    "annotations": image.manifest.annotations or {}}}
    if os.path.isdir(path):
        return _directory_summary(path, "podman-directory")
    if os.path.isfile(path):
        return _archive_summary(path)
    storage_name = path.removeprefix("containers-storage:")
    if not storage_name.startswith(("/", ".")) and (stored := _storage_image_summary(storage_name)) is not None:
        return stored
    raise NotFoundError(f"{path}: no such checkpoint archive, image layout, directory or podman image")


def run(options: argparse.Namespace) -> int:
    inspected = Inspected.model_validate(_summary(options.path))
    if options.json:
        inspected.print_json()
        return 0
    summary = inspected.model_dump()
    manifest = summary["manifest"]
    print(f"{summary['path']}: {summary['kind']}, {counted(summary['files'], 'file')}, {size_text(summary['bytes'])}"
          f" ({size_text(summary['stored_bytes'])} stored)")
    if summary["container"]:
        container = summary["container"]
        print(f"{summary['engine']:<11} container {container_label(container['name'], container['id'])}, image "
              f"{container['image'] or '-'}, runtime {container['runtime'] or '-'}, created "
              f"{container['created'] or '-'}")
    if summary["image"] is not None:
        image = summary["image"]
        where = (f"layer {image['layer_digest'][:19]} ({image['layer_media_type'].rsplit('.', 1)[-1]})"
                 if image["layer_digest"] else "in podman's storage")
        print(f"image       {image['tag'] or '-'}, {where}")
    if manifest is None:
        print("no gpuckpt manifest: not made through gpuckpt-runtime")
        return 0
    timings = manifest["timings"]
    print(f"container   {short_id(manifest['container_id'])}  (created {manifest['created']})")
    print(f"delegate    {manifest['delegate']}  args: {' '.join(manifest['delegate_args'])}")
    print(f"GPU handler {manifest['gpu_handler']}; driver {manifest['driver_version'] or '-'}")
    if files := manifest.get("driver_files"):  # what a restore must bring again (docs/cdi.md)
        names = ", ".join(file["path"].rsplit("/", 1)[-1] for file in files[:3]) + (" ..." if files[3:] else "")
        print(f"driver files {len(files)} mapped, of driver {', '.join(sorted({f['version'] for f in files}))}: "
              f"{names}")
    for gpu in manifest["gpus"]:
        print(f"GPU {gpu['index']}       {gpu['name']} {gpu['uuid']} {gpu['memory_total_bytes'] >> 30} GiB")
    for cuda_process in manifest["processes"]:
        print(f"CUDA pid    {cuda_process['host_pid']} (in container {cuda_process['container_pid']}): "
              f"{cuda_process['checkpointed_bytes'] / 2**30:.2f} GiB on {', '.join(cuda_process['gpu_uuids']) or '-'}")
    network = manifest["network"]
    print(f"CRIU config {'; '.join(manifest['criu_config']) or 'none of the shim'}")
    print(f"network     added {' '.join(network['added_options']) or 'nothing'}; engine passed "
          f"{' '.join(network['engine_options']) or 'nothing'}; {len(network['tcp_connected'])} connected TCP, "
          f"lock {network['network_lock']}")
    print("timings     " + ", ".join(f"{k} {v:.3f} s" for k, v in timings.items() if v is not None))
    return 0
