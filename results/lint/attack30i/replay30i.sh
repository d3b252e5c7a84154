#!/bin/bash
# attack30i: replay attack30h's successes (HOLE F, E', G, masksub) and the clean controls against main's fixes.
set -u
D=/var/tmp/attack30i; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3; cd $D
imp() {  # gpuckpt import ARCHIVE TRUSTDIR PROOF
  podman rm -f -t 0 attack30i-src >/dev/null 2>&1
  echo "=== gpuckpt import $1 (trust $2) ($(date -u +%T))"
  GPUCKPT_CONFIG=$D/config.toml GPUCKPT_TRUST_DIR=$D/$2 timeout 200 gpuckpt import $1 2>&1 | tail -3 | cut -c1-900; echo "gpuckpt import rc=${PIPESTATUS[0]}"
  podman exec attack30i-src sh -c "$3" 2>&1; echo "exec rc=$?"
  podman rm -f -t 0 attack30i-src >/dev/null 2>&1
}
case $1 in
control)
  POLICY=node $H/run30i.sh src.tar.zst 'cat /tmp/count'; podman rm -f -t0 attack30i-src >/dev/null 2>&1
  imp src.tar.zst dtrust 'cat /tmp/count' ;;
devhosts|devshm)
  path=/etc/hosts; [ $1 = devshm ] && path=/dev/shm
  PROOF="grep ' $path ' /proc/self/mountinfo; ls $path | head -5"
  cp /etc/hosts $D/hosts.before
  $P $H/devpath.py src.tar.zst $1.tar.zst $path
  POLICY=node $H/run30i.sh $1.tar.zst "$PROOF"; podman rm -f -t0 attack30i-src >/dev/null 2>&1
  NOSIG=1 $P $H/devpath.py src.tar.zst $1-nosig.tar.zst $path
  POLICY=any $H/run30i.sh $1-nosig.tar.zst "$PROOF"; podman rm -f -t0 attack30i-src >/dev/null 2>&1
  imp $1-nosig.tar.zst itrust "$PROOF"
  cmp /etc/hosts $D/hosts.before && echo "host /etc/hosts unchanged" ;;
netjoin)
  sleep 900 & SP=$!
  echo "host netns $(readlink /proc/self/ns/net), sleep pid $SP"
  PROOF='readlink /proc/self/ns/net; ip -o link 2>/dev/null | cut -c1-60 || cat /proc/net/dev'
  $P $H/netjoin.py bsrc.tar.zst netjoin.tar.zst /proc/$SP/ns/net
  POLICY=node $H/run30i.sh netjoin.tar.zst "$PROOF"; podman rm -f -t0 attack30i-src >/dev/null 2>&1
  NOSIG=1 $P $H/netjoin.py bsrc.tar.zst netjoin-nosig.tar.zst /proc/$SP/ns/net
  POLICY=any $H/run30i.sh netjoin-nosig.tar.zst "$PROOF"; podman rm -f -t0 attack30i-src >/dev/null 2>&1
  imp netjoin-nosig.tar.zst itrust "$PROOF"
  kill $SP ;;
netvictim)
  podman rm -f -t0 attack30i-victim >/dev/null 2>&1
  podman run -d --name attack30i-victim --network bridge localhost/gpuckpt-test:latest sleep 900 >/dev/null
  NS=$(podman inspect attack30i-victim --format '{{.NetworkSettings.SandboxKey}}'); echo "victim netns $NS $(readlink $NS 2>/dev/null) $(stat -L -c %i $NS)"
  PROOF='readlink /proc/self/ns/net; cat /proc/net/dev | cut -c1-40'
  $P $H/netjoin.py bsrc.tar.zst netvictim.tar.zst $NS
  POLICY=node $H/run30i.sh netvictim.tar.zst "$PROOF"
  PID=$(podman inspect attack30i-src --format "{{.State.Pid}}"); echo "restored pid $PID netns $(readlink /proc/$PID/ns/net) victim $(readlink /proc/$(podman inspect attack30i-victim --format "{{.State.Pid}}")/ns/net)"
  podman rm -f -t0 attack30i-src attack30i-victim >/dev/null 2>&1 ;;
*) IMPORT=1 $H/replay.sh "$@" ;;
esac
