#!/usr/bin/env bash
# Copy the test bed's containerd 2.1 (Debian forky's, containerd.sh put it in /opt/gpuckpt/containerd:
# containerd and its runc v2 shim; Go programs linking only libc) and Debian's static catatonit (the pods'
# sandbox process, `catatonit -P`) into DEST/containerd/bin, for the lent GPU machine, which has no
# containerd 2.x. Run after setup.sh.   Usage: bundle-containerd.sh DEST
set -euo pipefail
[ $# = 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
prefix=${GPUCKPT_CONTAINERD_PREFIX:-/opt/gpuckpt/containerd}
dest=$1/containerd
rm -rf "$dest"
mkdir -p "$dest/bin"
for program in "$prefix/usr/bin/containerd" "$prefix/usr/bin/containerd-shim-runc-v2" /usr/bin/catatonit; do
    [ -x "$program" ] || { echo "bundle-containerd.sh: $program missing (run setup.sh)" >&2; exit 1; }
    cp "$program" "$dest/bin/"
done
echo "bundle-containerd.sh: $(du -sh "$dest" | cut -f1) in $dest"
