#!/usr/bin/env bash
# Copy Debian's docker engine (dockerd, containerd, its runc shim, the docker client, tini)
# into DEST/docker/bin, with the libraries dockerd links that Ubuntu 24.04 may lack in
# DEST/docker/lib, for the lent GPU machine, which has no docker. Run after install-system.sh.
#   Usage: bundle-docker.sh DEST
set -euo pipefail
[ $# = 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
dest=$1/docker
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
for program in /usr/sbin/dockerd /usr/bin/containerd /usr/bin/containerd-shim-runc-v2 /usr/bin/docker; do
    [ -x "$program" ] || { echo "bundle-docker.sh: $program missing (run install-system.sh)" >&2; exit 1; }
    cp "$program" "$dest/bin/"
done
cp -L /usr/bin/tini-static "$dest/bin/docker-init"  # dockerd's --init binary
ldd /usr/sbin/dockerd | awk '$1 ~ /^libdevmapper/ && $3 ~ /^\// { print $3 }' | while read -r lib; do
    cp -L "$lib" "$dest/lib/"
done
echo "bundle-docker.sh: $(du -sh "$dest" | cut -f1) in $dest"
