#!/bin/bash
# attack30k: restore an edited archive through podman's own `podman container restore --import`.
# POLICY=any: podman reads CONTAINERS_CONF=/var/tmp/attack30k/containers.conf (the node's, gpuckpt-runtime -> rt.sh,
# which runs the shim with GPUCKPT_TRUST_DIR=/var/tmp/attack30k/trust: restore:any there); POLICY=node: the node's
# own containers.conf and trust policy. Neither /etc/gpuckpt nor /etc/containers is changed.
# usage: POLICY=any|node run30i.sh ARCHIVE PROOF
set -u
D=/var/tmp/attack30k; cd $D
A=$1; PROOF=$2
# POLICY=node: dcontainers.conf -> rt-default.sh -> dtrust (the node key, NO allow_unsigned: the default policy;
# the node's own trust.toml held restore:any from someone's integration test during this review)
[ "${POLICY:-node}" = any ] && export CONTAINERS_CONF=$D/containers.conf || export CONTAINERS_CONF=$D/dcontainers.conf
echo "=== $A policy=${POLICY:-node} ($(date -u +%T))"
podman rm -f -t 0 attack30k-src >/dev/null 2>&1
timeout 200 podman container restore --import $A 2>&1 | tail -2 | cut -c1-900; echo "restore rc=${PIPESTATUS[0]}"
podman ps -a --filter name=attack30k-src --format '{{.Names}} {{.Status}}'
podman exec attack30k-src sh -c "$PROOF" 2>&1; echo "exec rc=$?"
