#!/bin/sh
# A real export to build the attacks from: a plain container of the test image, exported by gpuckpt.
set -eu
D=/var/tmp/attack30b
mkdir -p $D; chmod 700 $D
podman rm -f -t 0 attack30b-src >/dev/null 2>&1 || true
podman run -d --name attack30b-src --network none localhost/gpuckpt-test:latest \
  sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done'
sleep 2
gpuckpt export attack30b-src -o $D/src.tar.zst
podman rm -f -t 0 attack30b-src
ls -la $D/src.tar.zst
