#!/usr/bin/env bash
# Run a command inside the isolated Debian forky root made by forky-root.sh, as root:
#
#   in-forky.sh [--root DIR] [--fetch] [--] COMMAND [ARG...]
#
# The command runs in its own mount, network, UTS, IPC and PID namespaces, with the forky root
# as its / (pivot_root, not chroot: CRIU reads /proc/self/mountinfo and must see one coherent
# tree whose root is the root), a fresh /proc of its PID namespace, a fresh sysfs of its network
# namespace with the host's cgroup hierarchies bound below it (podman and CRIU need them), a
# private /dev (the usual nodes, its own devpts and mqueue), and tmpfs /run and /tmp. Its network
# namespace has only a loopback interface: nothing it runs can reach the host or the outside.
# The cgroups its containers leave behind are removed when it ends.
# tini is PID 1 (it reaps conmon's orphans and forwards signals); when the command ends, every
# process left in the namespace is killed and its mounts go with it.
#
# --fetch keeps the host's network namespace (its /etc/resolv.conf, and its CA bundle for pip):
# for forky-root.sh's apt-get and pip download steps only, which fetch from the Debian mirror
# and PyPI.
#
# Environment: GPUCKPT_FORKY_ROOT (default /var/cache/gpuckpt-testbed/forky/root).
set -euo pipefail

cgroup_hierarchies() {  # MOUNTPOINT FSTYPE OPTIONS of each cgroup hierarchy under /sys/fs/cgroup
    awk '{ split($0, halves, " - "); split(halves[2], fs, " ")
           if ((fs[1] == "cgroup" || fs[1] == "cgroup2") && $5 ~ "^/sys/fs/cgroup/") print $5, fs[1], fs[3] }' \
        /proc/self/mountinfo
}

if [ "${1:-}" = --inner ]; then
    # Second stage: PID 1 of the new PID namespace (unshare --fork), in the new mount namespace.
    shift
    root=$1 fetch=$2; shift 2
    mount --make-rprivate /
    mount --bind "$root" "$root"                 # pivot_root needs a mount point
    mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
    mount -t sysfs -o nosuid,nodev,noexec sysfs "$root/sys" 2>/dev/null ||
        mount --rbind /sys "$root/sys"           # --fetch: the host's network namespace owns sysfs
    # The host's cgroup hierarchies as they are (podman, runc and CRIU need them). Not a cgroup
    # namespace: crun 1.28 restored a container of test_registry's second storage root into the
    # namespace's root cgroup, then froze and killed everything in it (the whole run).
    mount --rbind /sys/fs/cgroup "$root/sys/fs/cgroup"
    mount -t tmpfs -o nosuid,mode=0755,size=64m tmpfs "$root/dev"
    for node in "null c 1 3" "zero c 1 5" "full c 1 7" "random c 1 8" "urandom c 1 9" "tty c 5 0"; do
        read -r name type major minor <<<"$node"
        mknod -m 0666 "$root/dev/$name" "$type" "$major" "$minor"
    done
    mkdir -p "$root/dev/net" "$root/dev/pts" "$root/dev/shm" "$root/dev/mqueue"
    mknod -m 0666 "$root/dev/net/tun" c 10 200   # criu check probes it
    mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts "$root/dev/pts"
    ln -s pts/ptmx "$root/dev/ptmx"
    ln -s /proc/self/fd "$root/dev/fd"
    ln -s /proc/self/fd/0 "$root/dev/stdin"
    ln -s /proc/self/fd/1 "$root/dev/stdout"
    ln -s /proc/self/fd/2 "$root/dev/stderr"
    mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$root/dev/shm"
    mount -t mqueue -o nosuid,nodev,noexec mqueue "$root/dev/mqueue"
    mount -t tmpfs -o nosuid,nodev,mode=0755,size=2g tmpfs "$root/run"
    mount -t tmpfs -o nosuid,nodev,mode=1777,size=8g tmpfs "$root/tmp"
    # The test image's tarball (install-system.sh made it on the host), read-only.
    tarball=/var/cache/gpuckpt-testbed/rootfs-python.tar
    if [ -f "$tarball" ]; then
        mkdir -p "$root${tarball%/*}"
        : >>"$root$tarball"
        mount --bind -o ro "$tarball" "$root$tarball"
    fi
    fetch_env=()
    if [ "$fetch" = 1 ]; then
        cp /etc/resolv.conf "$root/etc/resolv.conf"
        # The host's trust store for pip (a machine behind a TLS-inspecting proxy trusts its CA
        # there; forky's ca-certificates does not know it).
        if [ -s /etc/ssl/certs/ca-certificates.crt ]; then
            : >"$root/run/host-ca-certificates.crt"
            mount --bind -o ro /etc/ssl/certs/ca-certificates.crt "$root/run/host-ca-certificates.crt"
            fetch_env=(PIP_CERT=/run/host-ca-certificates.crt)
        fi
    else
        ip link set lo up
    fi
    hostname gpuckpt-forky
    cd "$root"
    mkdir -p .oldroot
    pivot_root . .oldroot
    cd /
    # From here on, every program is forky's.
    umount -l /.oldroot
    rmdir /.oldroot
    exec /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" "${fetch_env[@]}" \
        /usr/bin/tini -s -g -- "$@"
fi

[ "$(id -u)" = 0 ] || { echo "in-forky.sh: run as root" >&2; exit 1; }
root=${GPUCKPT_FORKY_ROOT:-/var/cache/gpuckpt-testbed/forky/root}
fetch=0
while [ $# -gt 0 ]; do
    case $1 in
        --root) root=$2; shift 2;;
        --fetch) fetch=1; shift;;
        --) shift; break;;
        *) break;;
    esac
done
[ $# -gt 0 ] || { echo "usage: in-forky.sh [--root DIR] [--fetch] [--] COMMAND [ARG...]" >&2; exit 2; }
root=$(readlink -f "$root")
[ -x "$root/usr/bin/tini" ] || { echo "in-forky.sh: no forky root at $root (run integration/testbed/forky-root.sh)" >&2; exit 1; }

# A named cgroup v1 hierarchy that a container mounted and left behind (test_image_creds' escape
# makes one) holds every process of the machine in its root: crun, asked to kill or delete a
# container, then signals every process in that root, here the whole run (and on the host,
# every process). One that nothing mounts any more is removed first: mounted once more in a
# private mount namespace, its child cgroups removed, unmounted.
for name in $(sed -n 's/^[0-9]*:name=\([^:]*\):.*/\1/p' /proc/self/cgroup); do
    [ "$name" != systemd ] || continue
    ! grep -qsF "name=$name" /proc/[0-9]*/mountinfo || continue     # mounted somewhere: in use
    echo "in-forky.sh: removing the stale cgroup hierarchy name=$name (nothing mounts it)" >&2
    unshare --mount --propagation private -- sh -c 'd=$(mktemp -d) && mount -t cgroup -o "none,name=$1" cgroup "$d" &&
        find "$d" -mindepth 1 -depth -type d -exec rmdir {} \; ; umount "$d"; rmdir "$d"' - "$name" || true
done

# The cgroups the run's containers leave (their processes die with its PID namespace; a failed
# crun restore leaves its cgroup too) are removed afterwards: the test names repeat from run to
# run, as PIDs in a fresh namespace do, and a stale cgroup of the same name fails the next run.
cgroup_dirs() {
    cgroup_hierarchies | while read -r point _; do find "$point" -mindepth 1 -maxdepth 4 -type d; done | sort
}
before=$(mktemp)
cgroup_dirs >"$before"
cleanup() {
    # New since the start, deepest first, and only what the run's engines name: a bundle's
    # gpuckpt-* (the tests' runc-level containers, with crun's .proxy-crun below) or podman's
    # libpod-ID, not one of the host podman's own containers. rmdir refuses a cgroup that still holds a process.
    local host_ids
    host_ids=$(timeout 20 podman ps -a -q --no-trunc 2>/dev/null || true)
    cgroup_dirs | comm -13 "$before" - | sort -r | while read -r dir; do
        case ${dir##*/} in
            gpuckpt-*) ;;
            libpod-*) ! grep -qx "${dir##*/libpod-}" <<<"$host_ids" || continue;;
            *) [[ $dir == /sys/fs/cgroup/*/gpuckpt-*/* || $dir == */libpod_parent/libpod-* ]] || continue;;
        esac
        rmdir "$dir" 2>/dev/null || true
    done
    rm -f "$before"
}
trap cleanup EXIT
namespaces=(--mount --uts --ipc --pid --fork --kill-child)
[ "$fetch" = 1 ] || namespaces+=(--net)
set +e
unshare "${namespaces[@]}" -- bash "$(readlink -f "$0")" --inner "$root" "$fetch" "$@"
status=$?
exit "$status"
