#!/usr/bin/env bash
# Build gpuckpt-runtime's launcher (shim/resident/launcher.c) for one installation.
# Usage: build.sh OUTPUT PYTHON SITE — PYTHON the installation's interpreter, SITE its site-packages
# (their final paths). Uses $CC (default cc), dpkg-buildflags' hardening where there is dpkg, zlib.
# Exits 3 when there is no C compiler or zlib header: the caller keeps the Python launcher.
set -euo pipefail
out=$1 python=$2 site=$3
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || { echo "shim/resident/build.sh: no C compiler ($cc)" >&2; exit 3; }
[ -e /usr/include/zlib.h ] || { echo "shim/resident/build.sh: no zlib.h (zlib1g-dev)" >&2; exit 3; }
for value in "$python" "$site"; do
    case $value in *[!A-Za-z0-9_./+-]*) echo "shim/resident/build.sh: path $value has characters a C string here may not" >&2; exit 1;; esac
done
cflags="-O2 -Wall -Wextra -Werror -fstack-protector-strong -D_FORTIFY_SOURCE=2"
ldflags="-Wl,-z,relro -Wl,-z,now"
if command -v dpkg-buildflags >/dev/null 2>&1; then
    cflags="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS) -Wall -Wextra -Werror"
    ldflags=$(dpkg-buildflags --get LDFLAGS)
fi
# shellcheck disable=SC2086  # the flags are words
"$cc" $cflags -std=c11 -DGPUCKPT_PYTHON="\"$python\"" -DGPUCKPT_SITE="\"$site\"" \
    -o "$out" "$here/launcher.c" "$here/resident_call.c" $ldflags -lz
