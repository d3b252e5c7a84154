#!/usr/bin/env bash
# Build CRIU's CUDA plugin (plugins/cuda/cuda_plugin.so) for the carried CRIU, which Debian ships
# without it, as root after install-system.sh; for the peer column of integration/gpu/bench_engine.py.
#   Usage: build-criu-cuda-plugin.sh DEST      -> DEST/cuda_plugin.so, DEST/BUILT-FOR
# Source: Debian's source package of the very version the carried CRIU is (apt-get source from
# the suite install-system.sh took it from), so the plugin sees the same struct cr_options and hook
# table as that binary. Where the mirror lacks the Debian part (debian.tar.xz), Debian's orig
# tarball is used (upstream's release, checked against the .dsc's sha256).
# Built inside a debootstrapped root of that suite with Debian's own build dependencies
# (apt-get build-dep): the compiler, headers and libc are the ones the carried criu was built with
# and runs with; nothing is installed on this machine. The root is cached in $cache.
# Then checked: every symbol the plugin needs is exported by the carried criu or its libraries,
# and the carried criu loads it (`criu dump --libdir DEST` of a sleeping process: no GPU here, so
# it says the plugin is disabled).
# Environment: GPUCKPT_CRIU_PREFIX (default /opt/gpuckpt/criu), GPUCKPT_CRIU_SUITE (default forky),
#              GPUCKPT_DEBIAN_MIRROR (default: the mirror of the existing apt sources).
set -euo pipefail
[ $# = 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "build-criu-cuda-plugin.sh: run as root" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
dest=$(mkdir -p "$1" && cd "$1" && pwd)
prefix=${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt/criu}
suite=${GPUCKPT_CRIU_SUITE:-forky}
cache=/var/cache/gpuckpt-testbed/criu-cuda-plugin
root=$cache/root-$suite
export DEBIAN_FRONTEND=noninteractive PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
. "$here/debian-mirror.sh"
mirror=${GPUCKPT_DEBIAN_MIRROR:-$(debian_mirror)}

criu() { GPUCKPT_CRIU_PREFIX=$prefix "$here/criu-wrapper.sh" "$@"; }
upstream=$(criu --version | sed -n 's/^Version: //p')
[ -n "$upstream" ] || { echo "build-criu-cuda-plugin.sh: no CRIU in $prefix (run install-system.sh)" >&2; exit 1; }
in_root() {  # run a shell command in the build root (its own mount namespace: /proc is gone after)
    unshare --mount --propagation private -- bash -c 'mount -t proc proc "$0/proc" &&
        cp /etc/resolv.conf "$0/etc/resolv.conf" && exec chroot "$0" /usr/bin/env -i \
        PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive bash -ec "$1"' \
        "$root" "$1"
}

# --- 1. the build root: $suite minbase, deb-src, Debian's build dependencies of criu ----------------
if [ ! -e "$root/.built-deps" ]; then
    rm -rf --one-file-system "$root"
    mkdir -p "$cache"
    # bookworm's debootstrap has no script for forky: sid's is the one for testing (forky-root.sh)
    script=/usr/share/debootstrap/scripts/$suite
    [ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
    unshare --mount --propagation private -- debootstrap --variant=minbase "$suite" "$root" "$mirror" "$script" \
        >"$cache/debootstrap.log" 2>&1 || { tail -n 30 "$cache/debootstrap.log" >&2; exit 1; }
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" && chmod 0755 "$root/usr/sbin/policy-rc.d"
    echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/90gpuckpt-testbed"
    printf 'deb %s %s main\ndeb-src %s %s main\n' "$mirror" "$suite" "$mirror" "$suite" >"$root/etc/apt/sources.list"
    in_root 'apt-get update -q && apt-get install -y -q --no-install-recommends build-essential dpkg-dev ca-certificates' \
        >"$cache/apt.log" 2>&1 || { tail -n 30 "$cache/apt.log" >&2; exit 1; }
    touch "$root/.built-deps"
fi
# The Debian version of the carried CRIU ($upstream-N): the suite's source of that upstream version.
in_root 'apt-get update -q' >"$cache/apt.log" 2>&1 || { tail -n 30 "$cache/apt.log" >&2; exit 1; }
debver=$(in_root "apt-cache showsrc criu | sed -n 's/^Version: //p'" | grep -m1 -E "^([0-9]+:)?${upstream//./\\.}-" || true)
[ -n "$debver" ] || { echo "build-criu-cuda-plugin.sh: $suite has no criu source of $upstream (the carried CRIU)" >&2; exit 1; }
in_root "apt-get build-dep -y -q --no-install-recommends criu=$debver" >>"$cache/apt.log" 2>&1 ||
    { tail -n 30 "$cache/apt.log" >&2; exit 1; }

# --- 2. the source: Debian's package (with its patches), else its orig tarball ---------------------
src=/build/criu-$debver
in_root "rm -rf /build && mkdir -p /build && cd /build && { apt-get source -q criu=$debver || true; }
    ls -d /build/criu-$upstream/debian >/dev/null 2>&1 && { mv /build/criu-$upstream $src; echo 'Debian source package (patches applied)' >/build/origin; exit 0; }
    rm -rf /build/criu-$upstream
    orig=\$(ls /build/criu_${upstream}.orig.tar.* 2>/dev/null | head -n1)
    dsc=\$(ls /build/criu_*.dsc | head -n1)
    [ -n \"\$orig\" ] && [ -n \"\$dsc\" ] || { echo 'no criu source from the mirror' >&2; exit 1; }
    want=\$(awk -v f=\"\${orig##*/}\" '/^Checksums-Sha256:/ { s = 1; next } /^[^ ]/ { s = 0 } s && \$3 == f { print \$1 }' \"\$dsc\")
    [ \"\$(sha256sum \"\$orig\" | cut -d' ' -f1)\" = \"\$want\" ] || { echo \"\$orig: sha256 differs from \$dsc\" >&2; exit 1; }
    mkdir -p $src && tar -C $src --strip-components=1 -xf \"\$orig\"
    echo \"Debian orig tarball \${orig##*/} (sha256 checked against \${dsc##*/}; the mirror has no debian.tar: no Debian patches)\" >/build/origin" \
    >"$cache/source.log" 2>&1 || { tail -n 20 "$cache/source.log" >&2; exit 1; }
origin=$(cat "$root/build/origin")

# --- 3. build: criu first (compel-host and the generated headers the plugin includes), then the plugin
in_root "cd $src && make -j$(nproc) cuda_plugin" >"$cache/build.log" 2>&1 || { tail -n 40 "$cache/build.log" >&2; exit 1; }
install -m 0755 "$root$src/plugins/cuda/cuda_plugin.so" "$dest/cuda_plugin.so"
strip --strip-debug "$dest/cuda_plugin.so"
printf 'criu %s (%s), %s\n' "$debver" "$suite" "$origin" >"$dest/BUILT-FOR"

# --- 4. checks against the carried CRIU --------------------------------------------------------------
# Every undefined symbol of the plugin must be defined by criu (it exports its own for plugins) or a
# library criu loads: a missing one would fail only when its hook first runs, in the middle of a dump.
libs=$prefix/usr/lib/x86_64-linux-gnu
missing=$(comm -23 <(nm -D --undefined-only "$dest/cuda_plugin.so" | awk '{ print $2 }' | sed 's/@.*//' | sort -u) \
    <({ nm -D --defined-only "$prefix/usr/sbin/criu"
        criu --gpuckpt-list | awk '$2 == "=>" { print $3 }' | xargs -r nm -D --defined-only; } \
      | awk '{ print $3 }' | sed 's/@.*//' | sort -u) | grep -v -E '^(__gmon_start__|_ITM_.*|__cxa_finalize)$' || true)
[ -z "$missing" ] || { echo "build-criu-cuda-plugin.sh: the carried criu lacks: $missing" >&2; exit 1; }
# The carried criu loads it: a dump with --libdir DEST of a process of ours (the plugin disables
# itself without a GPU, and says so; on the GPU machine it needs cuda-checkpoint on PATH).
work=$(mktemp -d)
trap 'kill "$sleeper" 2>/dev/null || true; rm -rf "$work"' EXIT
setsid sleep 600 </dev/null >/dev/null 2>&1 &
sleeper=$!
criu dump -t "$sleeper" -D "$work" -o dump.log -v4 --libdir "$dest" --network-lock skip >/dev/null 2>&1 ||
    { tail -n 20 "$work/dump.log" >&2; exit 1; }
grep -q 'cuda_plugin' "$work/dump.log" || { echo "build-criu-cuda-plugin.sh: criu did not load $dest/cuda_plugin.so" >&2; exit 1; }
echo "build-criu-cuda-plugin.sh: $dest/cuda_plugin.so ($(stat -c %s "$dest/cuda_plugin.so") bytes) from $origin"
echo "criu $upstream --libdir $dest says:"
grep -E 'cuda_plugin|[Pp]lugin' "$work/dump.log" | sed 's/^/  /'
