"""`gpuckpt inspect ARCHIVE|DIR`: what a checkpoint holds, as text or --json, from the same data.

Container, GPUs, CUDA processes, network policy, CRIU options, timings and sizes; read
without unpacking an archive.
"""

from __future__ import annotations

import argparse
import json
import os

from gpuckpt.errors import UsageError


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("inspect", help="show what a checkpoint directory or archive holds")
    parser.add_argument("path", help="a checkpoint image directory or a gpuckpt archive (.tar.zst)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run)


def _summary(path: str) -> dict:
    from gpuckpt.oci.archive import list_archive, read_member
    from gpuckpt.oci.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, parse_manifest, read_manifest

    if os.path.isdir(path):
        manifest = read_manifest(path)
        sizes = [os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files]
        files, total = len(sizes), sum(sizes)
    elif os.path.isfile(path):
        entries = list_archive(path)
        raw = read_member(path, MANIFEST_NAME, MAX_MANIFEST_BYTES)
        manifest = parse_manifest(raw, f"{path}:{MANIFEST_NAME}") if raw is not None else None
        files, total = sum(not e.is_dir for e in entries), sum(e.size for e in entries)
    else:
        raise UsageError(f"{path}: no such checkpoint directory or archive")
    return {"path": path, "files": files, "bytes": total,
            "manifest": manifest.model_dump() if manifest else None}


def run(options: argparse.Namespace) -> int:
    summary = _summary(options.path)
    if options.json:
        print(json.dumps(summary, indent=2))
        return 0
    manifest = summary["manifest"]
    print(f"{summary['path']}: {summary['files']} files, {summary['bytes'] / 2**20:.1f} MiB")
    if manifest is None:
        print("no gpuckpt manifest: not made through gpuckpt-runtime")
        return 0
    timings = manifest["timings"]
    print(f"container   {manifest['container_id']}  (created {manifest['created']})")
    print(f"delegate    {manifest['delegate']}  args: {' '.join(manifest['delegate_args'])}")
    print(f"GPU handler {manifest['gpu_handler']}; driver {manifest['driver_version'] or '-'}")
    for gpu in manifest["gpus"]:
        print(f"GPU {gpu['index']}       {gpu['name']} {gpu['uuid']} {gpu['memory_total_bytes'] >> 30} GiB")
    for process in manifest["processes"]:
        print(f"CUDA pid    {process['host_pid']} (in container {process['container_pid']}): "
              f"{process['checkpointed_bytes'] / 2**30:.2f} GiB on {', '.join(process['gpu_uuids']) or '-'}")
    network = manifest["network"]
    print(f"network     added {' '.join(network['added_options']) or 'nothing'}; engine passed "
          f"{' '.join(network['engine_options']) or 'nothing'}; {len(network['tcp_connected'])} connected TCP, "
          f"lock {network['network_lock']}")
    print("timings     " + ", ".join(f"{k} {v:.3f} s" for k, v in timings.items() if v is not None))
    return 0
