#!/bin/bash
# attack30l: what the fix still lets through, through this branch's shim (ndcontainers.conf -> rtn-default.sh):
# (1) a named network namespace no process is in (the operator's `ip netns add`, as `--network ns:PATH` uses;
# integration/test_tcp.py's case), joined by a SIGNED export's spec.dump: allowed by design;
# (2) a local `podman container checkpoint` + `restore` of a bridge container: podman makes a new netns, its record.
set -u; D=/var/tmp/attack30l; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3; cd $D
export CONTAINERS_CONF=$D/ndcontainers.conf
ip netns add attack30l-ns
$P $H/nsjoin.py bsrc.tar.zst emptyns.tar.zst network=/run/netns/attack30l-ns
echo "=== (1) spec.dump network=/run/netns/attack30l-ns (no process in it) $(date -u +%T)"
podman rm -f -t0 attack30l-src >/dev/null 2>&1
timeout 200 podman container restore --import emptyns.tar.zst 2>&1 | tail -1 | cut -c1-400; echo "restore rc=${PIPESTATUS[0]}"
PID=$(podman inspect attack30l-src --format '{{.State.Pid}}'); echo "container net $(readlink /proc/$PID/ns/net), attack30l-ns $(stat -L -c %i /run/netns/attack30l-ns)"
podman rm -f -t0 attack30l-src >/dev/null 2>&1; ip netns del attack30l-ns
echo "=== (2) local checkpoint/restore of a bridge container $(date -u +%T)"
podman run -d --name attack30l-local --network bridge localhost/gpuckpt-test:latest sleep 600 >/dev/null
podman container checkpoint attack30l-local 2>&1 | tail -1; echo "checkpoint rc=${PIPESTATUS[0]}"
podman container restore attack30l-local 2>&1 | tail -1; echo "restore rc=${PIPESTATUS[0]}"
podman inspect attack30l-local --format '{{.State.Status}} {{.NetworkSettings.SandboxKey}}'
podman rm -f -t0 attack30l-local >/dev/null 2>&1
