#!/bin/bash
# attack30l: a pod member checkpointed and restored in place (what `gpuckpt checkpoint/restore --group` does for a
# pod's ranks) through this branch's shim: its spec keeps /proc/INFRA_PID/ns/{net,ipc,uts}, the pod's running infra.
set -u; D=/var/tmp/attack30l; cd $D; export CONTAINERS_CONF=$D/ndcontainers.conf
podman pod exists attack30l-pod || podman pod create --name attack30l-pod >/dev/null
podman rm -f -t0 attack30l-member >/dev/null 2>&1
podman run -d --pod attack30l-pod --name attack30l-member localhost/gpuckpt-test:latest sleep 600 >/dev/null; sleep 1
podman container checkpoint attack30l-member 2>&1 | tail -1; echo "checkpoint rc=${PIPESTATUS[0]}"
podman container restore attack30l-member 2>&1 | tail -1 | cut -c1-400; echo "restore rc=${PIPESTATUS[0]}"
INFRA=$(podman inspect $(podman pod inspect attack30l-pod --format '{{.InfraContainerID}}') --format '{{.State.Pid}}')
M=$(podman inspect attack30l-member --format '{{.State.Pid}}')
echo "member net $(readlink /proc/$M/ns/net) ipc $(readlink /proc/$M/ns/ipc); infra $INFRA net $(readlink /proc/$INFRA/ns/net) ipc $(readlink /proc/$INFRA/ns/ipc)"
podman rm -f -t0 attack30l-member >/dev/null 2>&1
