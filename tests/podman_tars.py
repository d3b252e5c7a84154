"""Test helper: tars shaped like podman's checkpoint export (`podman container checkpoint --export`)."""

from __future__ import annotations

import io
import json
import os
import tarfile

CONFIG = json.dumps({"id": "c0ffee" * 10 + "abcd", "name": "web", "rootfsImageName": "localhost/app:1",
                     "rootfsImageID": "ab" * 32, "RawImageName": "localhost/app:1", "runtime": "gpuckpt-runtime",
                     "lockID": 3}).encode()
# The isolation every `podman run` gives (podman 4.3's config.json on the CI machine): its own namespaces,
# a seccomp filter, the masked and read-only paths. An import refuses a config without it.
PODMAN_LINUX = {"namespaces": [{"type": kind} for kind in ("pid", "network", "ipc", "uts", "mount")],
                "seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []},
                "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                                "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                                "/sys/fs/selinux", "/sys/dev/block"],
                "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                                  "/proc/sysrq-trigger"]}
SPEC = json.dumps({"ociVersion": "1.0.2", "linux": PODMAN_LINUX}).encode()
MANIFEST = json.dumps({"schema_version": 1, "created": "2026-11-22T00:00:00Z", "container_id": "c1"}).encode()


def podman_tar(entries: list[tuple[str, bytes]] | None = None, manifest: bytes = MANIFEST, config: bytes = CONFIG,
               spec: bytes = SPEC) -> bytes:
    """A plain tar shaped like podman's export, with these extra entries."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directory = tarfile.TarInfo("checkpoint")
        directory.type, directory.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(directory)
        for name, data in [("checkpoint/inventory.img", b"inv"), ("checkpoint/pages-1.img", os.urandom(4096) * 8),
                           ("checkpoint/gpuckpt-manifest.json", manifest), ("config.dump", config),
                           ("spec.dump", spec), *(entries or [])]:
            info = tarfile.TarInfo(name)
            info.size, info.uid, info.uname = len(data), 1000, "someone"
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
