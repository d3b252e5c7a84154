#!/bin/sh
# attack30l: a real export of this node (signed by its key) of a container the attacker runs: payload.py, bridge network.
set -eu
D=/var/tmp/attack30l; H=$(dirname "$(readlink -f "$0")"); OUT=${1:-psrc.tar.zst}
podman rm -f -t 0 attack30l-psrc >/dev/null 2>&1 || true
podman run -d --name attack30l-psrc --network bridge localhost/gpuckpt-test:latest python3 -c "$(cat $H/payload.py)" >/dev/null
sleep 2
gpuckpt export attack30l-psrc -o $D/$OUT
podman rm -f -t 0 attack30l-psrc
