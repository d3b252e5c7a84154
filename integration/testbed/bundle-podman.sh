#!/usr/bin/env bash
# Copy Debian's podman and conmon into DEST/podman/bin, with every library they link but the C
# library itself in DEST/podman/lib (Ubuntu 24.04 lacks several: libgpgme, libsubid, ...), for
# the lent GPU machine, which has no podman. integration/gpu/harness.py puts the libraries on
# LD_LIBRARY_PATH (podman re-executes itself: the loader trick CRIU's wrapper uses would break
# it) and writes the containers configuration. Run after install-system.sh.
#   Usage: bundle-podman.sh DEST
set -euo pipefail
[ $# = 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
dest=$1/podman
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
for program in /usr/bin/podman /usr/bin/conmon; do
    [ -x "$program" ] || { echo "bundle-podman.sh: $program missing (run install-system.sh)" >&2; exit 1; }
    cp "$program" "$dest/bin/"
    ldd "$program" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
        case $name in libc.so.*|libm.so.*|ld-linux*) continue;; esac
        cp -L "$path" "$dest/lib/$name"
    done
done
echo "bundle-podman.sh: $(du -sh "$dest" | cut -f1) in $dest"
