#!/usr/bin/env bash
# The image integration/test_systemd.py boots: Debian 12 (bookworm) with systemd as PID 1, podman and
# runc, into which the test installs the .deb. Built once from the cached bookworm minbase tarball
# (debootstrapped from the machine's Debian mirror on first use, as test_packages.py does), kept as
# a tarball in /var/cache/gpuckpt-testbed and imported into podman as localhost/gpuckpt-systemd;
# rebuilt when this script changes. Prints the image's name. Run as root.
#
# What the image holds beyond Debian's packages, for this machine (cgroup v1 hybrid, PID 1 not
# systemd, podman's cgroupfs manager):
#   - /usr/local/sbin/gpuckpt-testbed-init, its PID 1: systemd in unified (cgroup v2) mode over the
#     container's own subtree. The host's controllers are all on v1 hierarchies; systemd on them, in
#     a container, leaves its cgroups in the host's name=systemd root and CRIU cannot walk the
#     container's cgroup there ("failed walking .../../machine.slice/libpod-ID.scope").
#   - podman settings: the rlimits this machine allows (../shared/LAB.md), and no pids limit (the
#     v2 subtree has no pids controller: runc fails writing pids.max).
#   - /usr/local/sbin/criu: the test bed's CRIU wrapper; the test binds /opt/gpuckpt/criu (CRIU 4.2
#     and its libraries, install-system.sh) read-only. Debian 12's own CRIU fails on this kernel.
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "systemd-image.sh: run as root" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
export DEBIAN_FRONTEND=noninteractive
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cache=/var/cache/gpuckpt-testbed
minbase=$cache/bookworm-minbase.tar
image_tar=$cache/systemd-bookworm.tar
image=localhost/gpuckpt-systemd:latest
packages=(systemd systemd-sysv dbus podman conmon runc iptables python3.11 procps)
layout=$(cat "$0" "$here/criu-wrapper.sh" | sha256sum | cut -c1-16)

. "$here/debian-mirror.sh"

if [ "$(cat "$image_tar.layout" 2>/dev/null)" != "$layout" ] || [ ! -s "$image_tar" ]; then
    mkdir -p "$cache"
    build=$(mktemp -d "$cache/systemd-image.XXXXXX")
    trap 'rm -rf --one-file-system "$build"' EXIT
    if [ ! -s "$minbase" ]; then
        unshare --mount --propagation private -- \
            debootstrap --variant=minbase bookworm "$build/root" "$(debian_mirror)" >"$build/debootstrap.log" 2>&1 ||
            { tail -n 30 "$build/debootstrap.log" >&2; exit 1; }
        tar -C "$build/root" --one-file-system --numeric-owner --exclude=./proc/* --exclude=./sys/* \
            -cf "$minbase.tmp" .
        mv -f "$minbase.tmp" "$minbase"
        rm -rf --one-file-system "$build/root"
    fi
    root=$build/root
    mkdir -p "$root"
    tar -C "$root" --numeric-owner -xf "$minbase"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"  # nothing starts while it is built
    chmod 0755 "$root/usr/sbin/policy-rc.d"
    # /proc only inside a mount namespace of its own: it goes when the namespace does.
    unshare --mount --propagation private -- bash -c '
        mount -t proc proc "$1/proc" && chroot "$1" apt-get update -q &&
        chroot "$1" apt-get install -y -q --no-install-recommends "${@:2}"' - "$root" "${packages[@]}" \
        >"$build/apt.log" 2>&1 || { tail -n 30 "$build/apt.log" >&2; exit 1; }
    chroot "$root" apt-get clean
    rm -rf "$root/usr/sbin/policy-rc.d" "$root"/var/lib/apt/lists/* "$root/etc/resolv.conf"
    : >"$root/etc/machine-id"  # systemd makes one at each boot
    install -m 0755 "$here/criu-wrapper.sh" "$root/usr/local/sbin/criu"
    cat >"$root/usr/local/sbin/gpuckpt-testbed-init" <<'EOF'
#!/bin/sh
# PID 1 of gpuckpt's systemd test container (integration/testbed/systemd-image.sh): the cgroup v2
# hierarchy of the container's own cgroup namespace in place of podman's v1 mounts, then systemd.
set -e
umount -R /sys/fs/cgroup 2>/dev/null || umount -l /sys/fs/cgroup
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
exec /sbin/init "$@"
EOF
    chmod 0755 "$root/usr/local/sbin/gpuckpt-testbed-init"
    mkdir -p "$root/etc/containers/containers.conf.d"
    cat >"$root/etc/containers/containers.conf.d/10-gpuckpt-testbed.conf" <<'EOF'
# gpuckpt's systemd test container (integration/testbed/systemd-image.sh): what this machine allows
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=32768:32768"]
pids_limit = 0
EOF
    tar -C "$root" --one-file-system --numeric-owner --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* \
        -cf "$image_tar.tmp" .
    mv -f "$image_tar.tmp" "$image_tar"
    echo "$layout" >"$image_tar.layout"
    podman rmi -f "$image" >/dev/null 2>&1 || true
fi
if [ "$(podman image inspect --format '{{index .Labels "gpuckpt.layout"}}' "$image" 2>/dev/null)" != "$layout" ]; then
    podman import --quiet --change "LABEL gpuckpt.layout=$layout" \
        --change 'CMD ["/usr/local/sbin/gpuckpt-testbed-init"]' "$image_tar" "$image" >/dev/null
fi
echo "$image"
