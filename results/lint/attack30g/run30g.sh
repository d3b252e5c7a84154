#!/bin/bash
# attack30g: restore an edited archive through podman's own `podman container restore --import`.
# POLICY=any: podman reads CONTAINERS_CONF=/var/tmp/attack30g/containers.conf (the node's, gpuckpt-runtime -> rt.sh,
# which runs the shim with GPUCKPT_TRUST_DIR=/var/tmp/attack30g/trust: restore:any there); POLICY=node: the node's
# own containers.conf and trust policy. Neither /etc/gpuckpt nor /etc/containers is changed.
# usage: POLICY=any|node run30g.sh ARCHIVE PROOF
set -u
D=/var/tmp/attack30g; cd $D
A=$1; PROOF=$2
[ "${POLICY:-node}" = any ] && export CONTAINERS_CONF=$D/containers.conf
echo "=== $A policy=${POLICY:-node} ($(date -u +%T))"
podman rm -f -t 0 attack30g-src >/dev/null 2>&1
timeout 200 podman container restore --import $A 2>&1 | tail -2 | cut -c1-900; echo "restore rc=${PIPESTATUS[0]}"
podman ps -a --filter name=attack30g-src --format '{{.Names}} {{.Status}}'
podman exec attack30g-src sh -c "$PROOF" 2>&1; echo "exec rc=$?"
