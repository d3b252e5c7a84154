#!/bin/sh
# gpuckpt test bed: CRIU from Debian trixie with its own libraries (libc included), run
# through that libc's loader, so that it works on a host with an older (or other) libc.
# The prefix is found relative to this file: DIR itself (the wrapper inside the prefix),
# DIR/../criu (bundle layout: bin/criu + criu/), or /opt/gpuckpt/criu; GPUCKPT_CRIU_PREFIX wins.
# Extra first arguments (not CRIU's): --gpuckpt-list shows the libraries resolved;
# --gpuckpt-exec PROG ARGS... runs another binary of the prefix the same way.
self=$(readlink -f "$0")
here=${self%/*}
for p in "${GPUCKPT_CRIU_PREFIX:-}" "$here" "$here/../criu" /opt/gpuckpt/criu; do
    [ -n "$p" ] && [ -x "$p/usr/sbin/criu" ] && break
done
[ -x "$p/usr/sbin/criu" ] || { echo "criu wrapper: no CRIU prefix found near $self" >&2; exit 127; }
libs=$p/usr/lib/x86_64-linux-gnu
[ -d "$p/lib/x86_64-linux-gnu" ] && libs=$libs:$p/lib/x86_64-linux-gnu
ld=$p/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
prog=$p/usr/sbin/criu
case ${1:-} in
    --gpuckpt-list) exec "$ld" --list --library-path "$libs" "$prog" ;;
    --gpuckpt-exec) prog=$2; shift 2 ;;
esac
exec "$ld" --library-path "$libs" "$prog" "$@"
