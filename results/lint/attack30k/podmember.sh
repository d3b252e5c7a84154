#!/bin/bash
# attack30k: a pod's member restores into its pod through this branch's shim (ndcontainers.conf -> rtn-default.sh):
# podman's --import --pod joins the infra container's namespaces as /proc/INFRA_PID/ns/TYPE, which podman's
# database names (pod -> InfraContainerID -> its state's pid). Also: a spec.dump naming ANOTHER pod's infra (a
# victim pod) is refused.
set -u; D=/var/tmp/attack30k; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3; cd $D
export CONTAINERS_CONF=$D/${DCONF:-ndcontainers.conf}
podman pod exists attack30k-pod || podman pod create --name attack30k-pod >/dev/null
podman pod exists attack30k-vpod || podman pod create --name attack30k-vpod >/dev/null
for c in attack30k-member attack30k-member2; do podman rm -f -t0 $c >/dev/null 2>&1; done
podman run -d --pod attack30k-pod --name attack30k-member localhost/gpuckpt-test:latest sleep 600 >/dev/null
podman run -d --pod attack30k-vpod --name attack30k-vmember localhost/gpuckpt-test:latest sleep 600 >/dev/null 2>&1
sleep 1; gpuckpt export attack30k-member -o $D/member.tar.zst 2>&1 | tail -1 | cut -c1-200
INFRA=$(podman inspect $(podman pod inspect attack30k-pod --format '{{.InfraContainerID}}') --format '{{.State.Pid}}')
VINFRA=$(podman inspect $(podman pod inspect attack30k-vpod --format '{{.InfraContainerID}}') --format '{{.State.Pid}}')
POD=$(podman pod inspect attack30k-pod --format "{{.ID}}")
echo "pod infra pid $INFRA, victim pod infra pid $VINFRA"
for v in own victimpod; do
  if [ $v = own ]; then A=member.tar.zst; else
    $P $H/nsjoin.py member.tar.zst vpod.tar.zst network=/proc/$VINFRA/ns/net ipc=/proc/$VINFRA/ns/ipc uts=/proc/$VINFRA/ns/uts; A=vpod.tar.zst; fi
  echo "=== $v: restore --import $A --pod $POD (attack30k-pod's ID: podman 4.3.1 takes an ID) ($(date -u +%T))"
  podman rm -f -t0 attack30k-member2 >/dev/null 2>&1
  timeout 200 podman container restore --import $A --pod $POD -n attack30k-member2 2>&1 | tail -1 | cut -c1-500; echo "restore rc=${PIPESTATUS[0]}"
  M=$(podman inspect attack30k-member2 --format '{{.State.Pid}}' 2>/dev/null)
  [ "${M:-0}" != 0 ] && echo "member2 net $(readlink /proc/$M/ns/net) ipc $(readlink /proc/$M/ns/ipc); infra net $(readlink /proc/$INFRA/ns/net) ipc $(readlink /proc/$INFRA/ns/ipc); victim pod net $(readlink /proc/$VINFRA/ns/net)"
done
# gpuckpt import --pod (this branch's gpuckpt; podman's runtime through ndcontainers.conf -> rtn-default.sh)
for v in own victimpod; do
  A=member.tar.zst; [ $v = victimpod ] && A=vpod.tar.zst
  echo "=== $v: gpuckpt import $A --pod attack30k-pod --trust-config ($(date -u +%T))"
  podman rm -f -t0 attack30k-member2 >/dev/null 2>&1
  GPUCKPT_CONFIG=$D/config.toml GPUCKPT_TRUST_DIR=$D/${ITRUST:-itrust} timeout 300 /opt/venv-attack30k/bin/gpuckpt import $D/$A --name attack30k-member2 --pod attack30k-pod --trust-config 2>&1 | grep -v "unsigned: accepted" | tail -2 | cut -c1-500; echo "import rc=${PIPESTATUS[0]}"
  M=$(podman inspect attack30k-member2 --format '{{.State.Pid}}' 2>/dev/null)
  [ "${M:-0}" != 0 ] && echo "member2 net $(readlink /proc/$M/ns/net) ipc $(readlink /proc/$M/ns/ipc); infra net $(readlink /proc/$INFRA/ns/net) ipc $(readlink /proc/$INFRA/ns/ipc); victim pod net $(readlink /proc/$VINFRA/ns/net)"
done
for c in attack30k-member attack30k-member2 attack30k-vmember; do podman rm -f -t0 $c >/dev/null 2>&1; done
