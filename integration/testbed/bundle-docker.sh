#!/usr/bin/env bash
# Copy Debian's docker engine (dockerd, containerd, its runc shim, the docker client, tini)
# into DEST/docker/bin, with the libraries dockerd links that Ubuntu 24.04 may lack in
# DEST/docker/lib, for the lent GPU machine, which has no docker. Run after install-system.sh.
# With ROOT (the forky root forky-root.sh builds): that root's docker 28.5 and containerd 2.1 into
# DEST/docker28/bin instead (Go programs that link libc, and dockerd libsystemd, libcap, libgcrypt and
# the compressors, all of which Ubuntu 24.04 has; glibc >= 2.34).
#   Usage: bundle-docker.sh DEST [ROOT]
set -euo pipefail
[ $# = 1 ] || [ $# = 2 ] || { echo "usage: $0 DEST [ROOT]" >&2; exit 2; }
root=${2:-}
dest=$1/docker${root:+28}
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
for program in /usr/sbin/dockerd /usr/bin/containerd /usr/bin/containerd-shim-runc-v2 /usr/bin/docker; do
    [ -x "$root$program" ] || { echo "bundle-docker.sh: $root$program missing (run ${root:+forky-root.sh}${root:-install-system.sh})" >&2; exit 1; }
    cp "$root$program" "$dest/bin/"
done
cp -L "$root/usr/bin/tini-static" "$dest/bin/docker-init"  # dockerd's --init binary
[ -z "$root" ] || { echo "bundle-docker.sh: $(du -sh "$dest" | cut -f1) in $dest"; exit 0; }
ldd /usr/sbin/dockerd | awk '$1 ~ /^libdevmapper/ && $3 ~ /^\// { print $3 }' | while read -r lib; do
    cp -L "$lib" "$dest/lib/"
done
echo "bundle-docker.sh: $(du -sh "$dest" | cut -f1) in $dest"
