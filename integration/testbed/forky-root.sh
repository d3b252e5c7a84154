#!/usr/bin/env bash
# Build or refresh the isolated Debian forky root of the second engine set, as root, on the
# Debian 12 test machine (after install-system.sh, whose test image tarball it uses):
#   - debootstrap --variant=minbase forky from the machine's Debian mirror, then forky's own
#     podman, runc, crun, CRIU, conmon, netavark, checkpointctl, skopeo, docker-registry,
#     python3 (+venv, +pycriu), iptables, tini through forky's apt-get: what an operator on that
#     distribution installs; and forky's docker.io 28 with its containerd 2.1 (a second list: a root
#     cached before it gets only those packages, installed on top, ~25 s, instead of a rebuild);
#   - the machine-specific podman settings (rlimits, cgroupfs, file events: ../shared/LAB.md) as a
#     drop-in, so that /etc/containers/containers.conf stays what `gpuckpt install` makes of it;
#   - a copy of this source tree at /src/gpuckpt inside the root (every run), and the wheels its
#     pyproject.toml needs (when that file changes) in /var/cache/gpuckpt-wheels inside the root,
#     so that packaging/install.sh runs there without a network.
# The root is cached in $GPUCKPT_FORKY_CACHE (default /var/cache/gpuckpt-testbed/forky) and
# rebuilt only when the package list or settings below change: a second run takes seconds.
# Only the apt-get and pip download steps see a network (in-forky.sh --fetch); nothing here
# touches the machine's own packages, apt state or mounts.
#
# Environment: GPUCKPT_DEBIAN_MIRROR (default: the mirror of the existing apt sources),
#              GPUCKPT_FORKY_SUITE (default forky).
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "forky-root.sh: run as root" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export DEBIAN_FRONTEND=noninteractive
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

suite=${GPUCKPT_FORKY_SUITE:-forky}
cache=${GPUCKPT_FORKY_CACHE:-/var/cache/gpuckpt-testbed/forky}
root=$cache/root
in_forky=$here/in-forky.sh
# libcriu2: crun loads it to checkpoint ("could not load libcriu.so.2" without it).
# nftables, aardvark-dns: netavark's firewall and DNS, which podman's default (bridge) network needs
# ("unable to execute nft" without it); only recommended by netavark, so --no-install-recommends drops them.
packages=(podman runc crun criu libcriu2 conmon netavark nftables aardvark-dns checkpointctl skopeo docker-registry tini
          python3 python3-venv python3-pycriu iptables zstd iproute2 procps ca-certificates)
layout="v1 $suite ${packages[*]}"
# The docker engine set (integration/forky/test_docker28.py): docker.io 28.5, its client, containerd 2.1.
docker_packages=(docker.io docker-cli containerd)
docker_layout="v1 ${docker_packages[*]}"

t0=$(date +%s)
say() { echo "forky-root.sh: $* ($(( $(date +%s) - t0 )) s)"; }

. "$here/debian-mirror.sh"

# --- 1. the root ---------------------------------------------------------------------------------
if [ "$(cat "$root/.gpuckpt-forky" 2>/dev/null)" = "$layout" ]; then
    say "root cached at $root"
else
    mirror=${GPUCKPT_DEBIAN_MIRROR:-$(debian_mirror)}
    build=$cache/root.new
    mkdir -p "$cache"
    # Anything debootstrap mounts inside the target lives and dies in a mount namespace of its
    # own; --one-file-system never walks into a mount either.
    [ ! -e "$build" ] || rm -rf --one-file-system "$build"
    say "debootstrap $suite from $mirror"
    # bookworm's debootstrap has no script named forky: sid's is the one for testing and unstable.
    script=/usr/share/debootstrap/scripts/$suite
    [ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
    unshare --mount --propagation private -- \
        debootstrap --variant=minbase "$suite" "$build" "$mirror" "$script" >"$cache/debootstrap.log" 2>&1 ||
        { tail -n 30 "$cache/debootstrap.log" >&2; exit 1; }
    # The mirror may be a dated snapshot whose testing Release has expired: accept it.
    echo 'Acquire::Check-Valid-Until "false";' >"$build/etc/apt/apt.conf.d/90gpuckpt-testbed"
    # No init system runs services in the root; keep package scripts from trying.
    printf '#!/bin/sh\nexit 101\n' >"$build/usr/sbin/policy-rc.d"
    chmod 0755 "$build/usr/sbin/policy-rc.d"
    say "apt-get install in the root: ${packages[*]}"
    # tini is what in-forky.sh runs as PID 1: install it with debootstrap's dpkg first.
    unshare --mount --propagation private -- bash -c '
        mount -t proc proc "$1/proc" && cp /etc/resolv.conf "$1/etc/resolv.conf" &&
        chroot "$1" apt-get update -q && chroot "$1" apt-get install -y -q --no-install-recommends tini' \
        - "$build" >"$cache/apt.log" 2>&1 || { tail -n 30 "$cache/apt.log" >&2; exit 1; }
    bash "$in_forky" --root "$build" --fetch -- \
        apt-get install -y -q --no-install-recommends "${packages[@]}" "${docker_packages[@]}" >>"$cache/apt.log" 2>&1 ||
        { tail -n 30 "$cache/apt.log" >&2; exit 1; }
    bash "$in_forky" --root "$build" --fetch -- apt-get clean
    # This machine's podman settings (../shared/LAB.md): podman's default nofile cannot be set
    # here; PID 1 is not systemd (no systemd cgroup manager, no journald).
    mkdir -p "$build/etc/containers/containers.conf.d"
    cat >"$build/etc/containers/containers.conf.d/10-gpuckpt-testbed.conf" <<'EOF'
# gpuckpt test bed (integration/testbed/forky-root.sh): settings this machine needs
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=32768:32768"]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    echo "$layout" >"$build/.gpuckpt-forky"
    echo "$docker_layout" >"$build/.gpuckpt-forky-docker"
    [ ! -e "$root" ] || rm -rf --one-file-system "$root"
    mv "$build" "$root"
    say "root built at $root"
fi

# --- 1b. the docker engine set, on a root cached before it (or with another docker list) -------
if [ "$(cat "$root/.gpuckpt-forky-docker" 2>/dev/null)" != "$docker_layout" ]; then
    say "apt-get install in the cached root: ${docker_packages[*]}"
    bash "$in_forky" --root "$root" --fetch -- sh -ec 'apt-get update -q && apt-get install -y -q --no-install-recommends "$@" &&
        apt-get clean' - "${docker_packages[@]}" >>"$cache/apt.log" 2>&1 || { tail -n 30 "$cache/apt.log" >&2; exit 1; }
    echo "$docker_layout" >"$root/.gpuckpt-forky-docker"
    say "docker engine set added to $root"
fi

# --- 2. this source tree, copied in (every run) --------------------------------------------------
src=$root/src/gpuckpt
rm -rf --one-file-system "$src"
mkdir -p "$src"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # tracked and untracked files, not ignored ones (no build/, venvs or caches)
    (cd "$repo" && git ls-files -z -c -o --exclude-standard | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' - \
        | tar --null -T - -cf -) | tar -C "$src" -xf -
else
    tar -C "$repo" --exclude=./.git -cf - . | tar -C "$src" -xf -
fi
say "source copied to $src"

# --- 3. the wheels install.sh needs (when pyproject.toml changes) --------------------------------
wheels=$root/var/cache/gpuckpt-wheels
want=$(sha256sum "$src/pyproject.toml" | cut -d' ' -f1)
if [ "$(cat "$wheels/.pyproject" 2>/dev/null)" != "$want" ]; then
    rm -rf "$wheels" && mkdir -p "$wheels"
    bash "$in_forky" --root "$root" --fetch -- sh -ec '
        python3 -m venv /tmp/wheels-venv
        /tmp/wheels-venv/bin/pip wheel -q --disable-pip-version-check -w /var/cache/gpuckpt-wheels "/src/gpuckpt[gpu,test]"
        /tmp/wheels-venv/bin/pip download -q --disable-pip-version-check -d /var/cache/gpuckpt-wheels "setuptools>=68"
        rm -f /var/cache/gpuckpt-wheels/gpuckpt-*.whl'
    echo "$want" >"$wheels/.pyproject"
    say "wheels for pyproject.toml in $wheels ($(ls "$wheels" | wc -l) files)"
fi
say "ready"
