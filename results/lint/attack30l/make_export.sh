#!/bin/sh
# attack30l: a real export of this node (signed by its key) to build the attacks from (attack30b's, renamed).
set -eu
D=/var/tmp/attack30l; NET=${1:-none}; OUT=${2:-src.tar.zst}  # NET: podman --network
mkdir -p $D; chmod 700 $D
podman rm -f -t 0 attack30l-src >/dev/null 2>&1 || true
podman run -d --name attack30l-src --network $NET localhost/gpuckpt-test:latest \
  sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done'
sleep 2
gpuckpt export attack30l-src -o $D/$OUT
podman rm -f -t 0 attack30l-src
ls -la $D/$OUT
