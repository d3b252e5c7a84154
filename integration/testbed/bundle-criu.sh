#!/usr/bin/env bash
# Copy CRIU (with the exact set of trixie libraries it loads, libc and loader included),
# its wrapper, and Debian's runc (+ libseccomp.so.2) into DEST, for a machine that has none
# of them (the lent GPU machine: Ubuntu 24.04).  Run after install-system.sh.
#   DEST/bin/criu      wrapper: runs DEST/criu/usr/sbin/criu through DEST/criu's own loader
#   DEST/bin/runc      wrapper: adds DEST/lib to LD_LIBRARY_PATH only when the host lacks
#                      libseccomp.so.2, then execs DEST/libexec/runc (native binary)
#   DEST/criu/...      the CRIU prefix (only what criu needs)
# Put DEST/bin first on PATH: runc runs `criu swrk` from PATH.  Usage: bundle-criu.sh DEST
set -euo pipefail
[ $# = 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt/criu}
runc=${GPUCKPT_RUNC:-/usr/sbin/runc}
dest=$1
[ -x "$src/usr/sbin/criu" ] || { echo "bundle-criu.sh: no CRIU in $src (run install-system.sh)" >&2; exit 1; }

rm -rf "$dest/bin/criu" "$dest/bin/runc" "$dest/libexec/runc" "$dest/lib/libseccomp.so.2" "$dest/criu"
mkdir -p "$dest/bin" "$dest/libexec" "$dest/lib" "$dest/criu/usr/sbin" "$dest/criu/usr/lib/x86_64-linux-gnu"
cp "$src/usr/sbin/criu" "$dest/criu/usr/sbin/criu"
# Exactly the libraries the loader resolves for criu (copied under their sonames).
GPUCKPT_CRIU_PREFIX=$src "$here/criu-wrapper.sh" --gpuckpt-list \
    | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' \
    | while read -r name path; do
        case $path in "$src"/*) ;; *) echo "bundle-criu.sh: $name resolves outside $src: $path" >&2; exit 1;; esac
        cp -L "$path" "$dest/criu/usr/lib/x86_64-linux-gnu/${name##*/}"
    done
cp -L "$src/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$dest/criu/usr/lib/x86_64-linux-gnu/"
install -m 0755 "$here/criu-wrapper.sh" "$dest/bin/criu"

cp "$runc" "$dest/libexec/runc"
seccomp=$(ldd "$runc" | awk '$1 == "libseccomp.so.2" { print $3 }')
cp -L "$seccomp" "$dest/lib/libseccomp.so.2"
cat >"$dest/bin/runc" <<'WRAP'
#!/bin/sh
# Debian bookworm's runc (links libc and libseccomp.so.2 only); see bundle-criu.sh.
self=$(readlink -f "$0"); d=${self%/*}/..
for l in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64; do
    [ -e "$l/libseccomp.so.2" ] && exec "$d/libexec/runc" "$@"
done
LD_LIBRARY_PATH=$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$d/libexec/runc" "$@"
WRAP
chmod 0755 "$dest/bin/runc"
"$dest/bin/criu" --version | head -n1 >/dev/null
echo "bundle-criu.sh: $(du -sh "$dest" | cut -f1) in $dest: $(cd "$dest" && find . -type f | wc -l) files"
