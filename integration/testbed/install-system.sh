#!/usr/bin/env bash
# Install the container test bed on a Debian 12 (bookworm) machine, as root:
#   - podman, docker.io, runc, crun, containerd and tools from bookworm;
#   - CRIU >= 4.2, crun (bookworm's crun 1.8.1 is built without CRIU: podman says "configured
#     runtime does not support checkpoint/restore") and checkpointctl from a newer Debian suite
#     ($GPUCKPT_CRIU_SUITE, default forky: CRIU 4.1 cannot dump TCP sockets on kernels >= 6.16,
#     which refuse SO_PASSCRED on them; fixed in CRIU 4.2), unpacked into a private prefix
#     (/opt/gpuckpt/criu) with that suite's own libc, run through
#     that libc's loader by the wrappers /usr/local/sbin/criu, /usr/local/bin/crun and
#     /usr/local/bin/checkpointctl; the machine's libc and packages are not touched;
#   - podman and dockerd configuration for this kind of machine (no systemd, cgroup v1);
#   - dockerd started in the background;
#   - the test image (trixie minbase + python3) imported into podman and docker.
# GPUCKPT_TESTBED=demo sets up only what integration/demo.sh's main job needs: podman (no docker,
# containerd, buildah, skopeo, registry or test tools; no recommended packages), runc, iptables,
# CRIU and crun as above, what packaging/install.sh builds with, and the test image in podman.
# The independent slow steps overlap: CRIU's download starts first, the test image's debootstrap as
# soon as apt has installed debootstrap; each prints its output and time when it is waited for,
# and the script fails with that step's name if it failed.
# Idempotent: a second run only checks and repairs.  No public registry is needed.
#
# Environment: GPUCKPT_TESTBED (full, the default: the test command's; demo),
#              GPUCKPT_DEBIAN_MIRROR (default: the mirror of the existing apt sources),
#              GPUCKPT_CRIU_PREFIX (default /opt/gpuckpt/criu).
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "install-system.sh: run as root" >&2; exit 1; }
testbed=${GPUCKPT_TESTBED:-full}
case $testbed in
    full|demo) ;;
    *) echo "install-system.sh: GPUCKPT_TESTBED=$testbed: allowed are full (the test command's, the default)" \
            "and demo (podman only, integration/demo.sh's)" >&2; exit 2;;
esac
here=$(cd "$(dirname "$0")" && pwd)
export DEBIAN_FRONTEND=noninteractive
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH

criu_prefix=${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt/criu}
suite=${GPUCKPT_CRIU_SUITE:-forky}
# crun stays at trixie's 1.21: forky's 1.28 fails to restore a bundle at runc level
# ("mnt: No mapping for N:(null) mountpoint" from CRIU); 1.21 passes every test here.
crun_suite=${GPUCKPT_CRUN_SUITE:-trixie}
layout="criu=$suite crun=$crun_suite"
state=/var/lib/gpuckpt-testbed          # private apt state for the newer suite's downloads
cache=/var/cache/gpuckpt-testbed        # debs and the image tarball
docker=/usr/bin/docker                  # Debian's client; /usr/local/bin/docker may be another one
image_tar=$cache/rootfs-python.tar

t0=$(date +%s); ts=$t0
step() {  # print the time the previous step took, then announce the next
    local now; now=$(date +%s)
    [ -z "${cur_step:-}" ] || echo "== $cur_step: $((now - ts)) s"
    ts=$now; cur_step=$1
    [ "$1" = done ] || echo "== $1"
}
# Steps that run beside the others: output held in a log, shown with the step's time when awaited.
jobs_dir=$(mktemp -d)
declare -A job_pid job_name
background() {  # KEY NAME FUNCTION: start FUNCTION beside the next steps
    local key=$1 name=$2; shift 2
    echo "== $name (beside the next steps)"
    ( job_start=$(date +%s); "$@"; echo "== $name: $(( $(date +%s) - job_start )) s" ) >"$jobs_dir/$key.log" 2>&1 &
    job_pid[$key]=$!; job_name[$key]=$name
}
await() {  # KEY: wait for a background step, show its output; fail with its name if it failed
    local key=$1 status=0
    wait "${job_pid[$key]}" || status=$?
    unset "job_pid[$key]"
    cat "$jobs_dir/$key.log"
    [ "$status" = 0 ] || { echo "install-system.sh: ${job_name[$key]} failed (status $status)" >&2; exit 1; }
}
# On a failure, background steps still end before the script does: nothing half-written keeps running.
trap 'for pid in "${job_pid[@]}"; do wait "$pid" 2>/dev/null || true; done; rm -rf "$jobs_dir"' EXIT

# --- the Debian mirror the machine already uses --------------------------------------------
. "$here/debian-mirror.sh"
mirror=${GPUCKPT_DEBIAN_MIRROR:-$(debian_mirror)}

# --- 1. CRIU >= 4.2 from a newer suite in a private prefix --------------------------------
# Needs only apt, dpkg-deb and the keyring every Debian has: it starts first and runs beside the apt
# step (its own apt lists, cache and status; the system's dpkg lock is never taken).
install_criu() {  # CRIU, crun and checkpointctl from the newer suite, pycriu beside them; then checked
    # A private apt configuration: the system's sources, preferences and dpkg status never see
    # that suite, so nothing on the machine can be upgraded from it by accident.
    mkdir -p "$state/etc/parts" "$state/etc/prefs" "$state/lists/partial" \
             "$cache/apt/archives/partial" "$cache/debs"
    rm -f "$state/etc/trixie.sources"
    cat >"$state/etc/newer.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $crun_suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    : >"$state/status.empty"
    tx_apt=(-o "Dir::Etc::SourceList=$state/etc/newer.sources" -o "Dir::Etc::SourceParts=$state/etc/parts"
            -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$state/etc/prefs"
            -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status.empty"
            -o "Dir::Cache=$cache/apt" -o "APT::Architecture=amd64" -o "APT::Architectures::=amd64"
            -o "APT::Sandbox::User=root")

    criu_ok() {
        [ -x /usr/local/sbin/criu ] && /usr/local/sbin/criu --version 2>/dev/null | grep -qE 'Version: (4\.([2-9]|[1-9][0-9])|[5-9])' &&
        [ -x /usr/local/bin/crun ] && /usr/local/bin/crun --version 2>/dev/null | grep -q '+CRIU'
    }
    wrapper_src=$here/criu-wrapper.sh
    if criu_ok && [ "$(cat "$criu_prefix/.complete" 2>/dev/null)" = "$layout" ] && cmp -s "$wrapper_src" /usr/local/sbin/criu; then
        echo "criu already installed: $(/usr/local/sbin/criu --version | head -n1)"
    else
        apt-get "${tx_apt[@]}" update -q
        want=(criu crun libcriu2)
        apt-cache "${tx_apt[@]}" show checkpointctl >/dev/null 2>&1 && want+=(checkpointctl)
        # criu, checkpointctl and everything they Depend on, recursively (libc6 included: it is
        # only ever used through its own loader, never installed).
        mapfile -t debs < <(apt-cache "${tx_apt[@]}" depends --recurse --no-recommends --no-suggests \
                --no-conflicts --no-breaks --no-replaces --no-enhances "${want[@]}" \
            | grep -v '^ ' | grep -v '^<' | sort -u)
        echo "$suite packages: ${debs[*]}"
        (cd "$cache/debs" && rm -f ./*.deb && apt-get "${tx_apt[@]}" download -q "${debs[@]}" &&
            rm -f ./crun_*.deb && apt-get "${tx_apt[@]}" download -q "crun/$crun_suite")
        rm -rf "$criu_prefix.new"
        mkdir -p "$criu_prefix.new"
        for d in "$cache"/debs/*.deb; do dpkg-deb -x "$d" "$criu_prefix.new"; done
        # Only what is needed at run time: drop docs, man pages, locales, headers.
        rm -rf "$criu_prefix.new"/usr/share/{doc,man,info,locale,lintian,bug} "$criu_prefix.new"/usr/include \
               "$criu_prefix.new"/etc "$criu_prefix.new"/usr/lib/x86_64-linux-gnu/gconv
        # CRIU looks for plugins only in /usr/lib/criu of the host, not here; the CUDA plugin
        # (if the package ships one) must not interfere with gpuckpt's own CUDA handling.
        cp "$wrapper_src" "$criu_prefix.new/criu"
        chmod 0755 "$criu_prefix.new/criu"
        echo "$layout" >"$criu_prefix.new/.complete"
        rm -rf "$criu_prefix.old"
        [ ! -e "$criu_prefix" ] || mv "$criu_prefix" "$criu_prefix.old"
        mv "$criu_prefix.new" "$criu_prefix"
        rm -rf "$criu_prefix.old"
        install -m 0755 "$wrapper_src" /usr/local/sbin/criu
        # crun and checkpointctl: direct wrappers (crun runs for every container operation).
        for prog in crun checkpointctl; do
            [ -x "$criu_prefix/usr/bin/$prog" ] || continue
            lib=$criu_prefix/usr/lib/x86_64-linux-gnu
            cat >"/usr/local/bin/$prog.tmp" <<EOF
#!/bin/sh
# gpuckpt test bed: Debian $suite's $prog with its own libc (install-system.sh)
exec $lib/ld-linux-x86-64.so.2 --library-path $lib $criu_prefix/usr/bin/$prog "\$@"
EOF
            chmod 0755 "/usr/local/bin/$prog.tmp"
            mv -f "/usr/local/bin/$prog.tmp" "/usr/local/bin/$prog"
        done
    fi
    criu_ok || { echo "install-system.sh: /usr/local/sbin/criu does not work" >&2; /usr/local/sbin/criu --version >&2 || true; exit 1; }
    # Every library the binary needs must come from the prefix, none from the host.
    if /usr/local/sbin/criu --gpuckpt-list | grep -E '=> (/usr)?/lib|not found' | grep -v -F "$criu_prefix" >&2; then
        echo "install-system.sh: criu resolves libraries outside $criu_prefix" >&2; exit 1
    fi
    # CRIU's own message definitions (python3-pycriu's generated protobuf modules, pure Python, the
    # same suite as the criu binary): gpuckpt reads the images' credentials with them before a
    # restore (oci/criu_images.py looks in this prefix). Only the package itself, no dependency: the
    # protobuf runtime is gpuckpt's own (pyproject.toml).
    pycriu_dir=$criu_prefix/usr/lib/python3/dist-packages/pycriu
    if [ ! -f "$pycriu_dir/images/core_pb2.py" ]; then
        apt-get "${tx_apt[@]}" update -q
        rm -rf "$cache/pycriu" && mkdir -p "$cache/pycriu"
        (cd "$cache/pycriu" && apt-get "${tx_apt[@]}" download -q "python3-pycriu/$suite" &&
            dpkg-deb -x python3-pycriu_*.deb root)
        mkdir -p "$(dirname "$pycriu_dir")"
        rm -rf "$pycriu_dir.new" && cp -r "$cache/pycriu/root/usr/lib/python3/dist-packages/pycriu" "$pycriu_dir.new"
        chown -R root:root "$pycriu_dir.new" && chmod -R go-w "$pycriu_dir.new"
        rm -rf "$pycriu_dir" && mv "$pycriu_dir.new" "$pycriu_dir"
    fi
    echo "pycriu:   $pycriu_dir ($(ls "$pycriu_dir"/images/*_pb2.py | wc -l) message modules)"
}

# --- 2. the test image's root (debootstrap), beside the apt step as soon as debootstrap is there ---
umount_below() {  # unmount everything mounted at or below DIR (deepest first)
    local dir; dir=$(readlink -f "$1")
    awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo \
        | sort -r | while read -r m; do umount -l "$m" || true; done
}
image_root=$cache/rootfs.build
build_image_tar() {  # trixie minbase + python3, as a tarball for the engines' import
    if [ -e "$image_root" ]; then umount_below "$image_root"; rm -rf --one-file-system "$image_root"; fi
    mkdir -p "$image_root"
    trap 'umount_below "$image_root"' EXIT  # this step's own subshell
    debootstrap --variant=minbase --include=python3-minimal trixie "$image_root" "$mirror" \
        >"$cache/debootstrap.log" 2>&1 || { tail -n 30 "$cache/debootstrap.log" >&2; exit 1; }
    umount_below "$image_root"
    trap - EXIT
    rm -rf "$image_root"/var/cache/apt/archives/*.deb "$image_root"/var/lib/apt/lists/* "$image_root"/var/log/*.log
    # --one-file-system: never follow into anything still mounted inside the root.
    tar -C "$image_root" --one-file-system --numeric-owner \
        --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* -cf "$image_tar.tmp" .
    mv -f "$image_tar.tmp" "$image_tar"
    rm -rf --one-file-system "$image_root"
}

# --- 3. bookworm packages ------------------------------------------------------------------
if [ "$testbed" = demo ]; then
    # What demo.sh needs: podman (netavark: its network backend, as the test bed has it) and runc (gpuckpt's
    # delegate), iptables (CRIU's network lock), debootstrap (the test image), python3-venv, gcc, libc6-dev,
    # zlib1g-dev (packaging/install.sh and its compiled launcher), ca-certificates (its wheels from PyPI),
    # the keyring (the newer suite's apt). No recommended packages: buildah, fuse-overlayfs, slirp4netns,
    # uidmap, catatonit (rootless podman and --init) and bookworm's criu 3.17 are not used.
    packages=(podman conmon crun runc netavark iptables debootstrap python3-venv gcc libc6-dev zlib1g-dev
              ca-certificates debian-archive-keyring xz-utils)
    recommends=(--no-install-recommends)
else
    packages=(podman conmon crun runc docker.io containerd containernetworking-plugins iptables skopeo buildah docker-registry
              zstd debootstrap python3-venv python3-pip uidmap slirp4netns iproute2 hyperfine jq
              containernetworking-plugins fuse-overlayfs catatonit tini procps psmisc
              ca-certificates debian-archive-keyring xz-utils
              gcc libc6-dev zlib1g-dev  # gpuckpt-runtime's compiled launcher (shim/resident/build.sh), as the packages build it
              python3-systemd)  # gpuckptd's python-systemd, Debian's (no libsystemd-dev: it would upgrade systemd)
    # With recommends: the test bed was built and tested that way (netavark among them).
    recommends=()
fi
background criu "CRIU from $suite into $criu_prefix" install_criu

step "apt packages (bookworm, mirror $mirror)"
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    # No init system starts services here; keep package scripts from trying (and failing).
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 0755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    apt-get update -q
    # debootstrap alone first: the test image's root is the longest step and needs nothing else.
    if [ ! -s "$image_tar" ] && ! command -v debootstrap >/dev/null; then
        apt-get install -y -q "${recommends[@]}" debootstrap
    fi
fi
[ -s "$image_tar" ] || background image "the test image's root (debootstrap of trixie into $cache)" build_image_tar
if [ ${#missing[@]} -gt 0 ]; then
    apt-get install -y -q "${recommends[@]}" "${missing[@]}"
    [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
else
    echo "all ${#packages[@]} packages already installed"
fi

# --- 4. podman configuration ---------------------------------------------------------------
step "cgroups and podman configuration"
# cgroup v1 hybrid: crun refuses to run while the unified (v2) hierarchy holds controllers
# ("crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2"); here
# hugetlb is left there.  Give each such controller a v1 hierarchy of its own (not persistent:
# a rerun after reboot does it again).
if [ -f /sys/fs/cgroup/unified/cgroup.controllers ]; then
    for c in $(cat /sys/fs/cgroup/unified/cgroup.controllers); do
        mkdir -p "/sys/fs/cgroup/$c"
        mountpoint -q "/sys/fs/cgroup/$c" || mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c" ||
            echo "install-system.sh: warning: could not move cgroup controller $c to v1" >&2
    done
fi

conf=/etc/containers/containers.conf
mkdir -p /etc/containers
[ -f "$conf" ] || : >"$conf"
# Set KEY = VALUE in [SECTION], keeping everything else; the section is added if missing.
/usr/bin/python3 - "$conf" <<'PY'
import re, sys
path = sys.argv[1]
want = {
    "containers": {
        # podman's default nofile=1048576 cannot be set here: every run fails with EPERM.
        "default_ulimits": '["nofile=16384:16384", "nproc=32768:32768"]',
    },
    "engine": {
        # PID 1 is not systemd: no systemd cgroup manager, no journald.
        "cgroup_manager": '"cgroupfs"',
        "events_logger": '"file"',
    },
    "engine.runtimes": {
        # the newer suite's crun (with CRIU) before bookworm's (without).
        "crun": '["/usr/local/bin/crun", "/usr/bin/crun"]',
    },
}
lines = open(path).read().splitlines()
out, section, done = [], None, set()
def flush(sec):
    for k, v in want.get(sec, {}).items():
        if (sec, k) not in done:
            out.append(f"{k} = {v}"); done.add((sec, k))
skip_cont = False
for line in lines:
    m = re.match(r"\s*\[\s*([A-Za-z0-9_.]+)\s*\]\s*(#.*)?$", line)
    if m:
        flush(section)
        section = m.group(1)
        out.append(line)
        continue
    if skip_cont:                      # continuation of a multi-line array we replaced
        if "]" in line:
            skip_cont = False
        continue
    k = re.match(r"\s*([A-Za-z0-9_]+)\s*=", line)
    if k and section in want and k.group(1) in want[section]:
        key = k.group(1)
        if (section, key) not in done:
            out.append(f"{key} = {want[section][key]}"); done.add((section, key))
        rest = line.split("=", 1)[1]
        if rest.count("[") > rest.count("]"):
            skip_cont = True
        continue
    out.append(line)
flush(section)
for sec in want:
    if any((sec, k) not in done for k in want[sec]):
        if out and out[-1].strip():
            out.append("")
        out.append(f"[{sec}]")
        flush(sec)
new = "\n".join(out) + "\n"
if new != open(path).read():
    open(path + ".tmp", "w").write(new)
    import os; os.replace(path + ".tmp", path)
    print(f"updated {path}")
PY
podman info --format '{{.Host.CgroupManager}} {{.Host.EventLogger}} {{.Host.OCIRuntime.Name}}'

# --- 5. docker (not for the demo) -----------------------------------------------------------
if [ "$testbed" = full ]; then
    step "dockerd"
    mkdir -p /etc/docker
    dj=/etc/docker/daemon.json
    [ -s "$dj" ] || echo '{}' >"$dj"
    if [ "$(jq -r '.experimental // false' "$dj")" != true ]; then
        jq '.experimental = true' "$dj" >"$dj.tmp" && mv -f "$dj.tmp" "$dj"
        restart_needed=1
    fi
    if "$docker" info >/dev/null 2>&1; then
        if [ -n "${restart_needed:-}" ]; then bash "$here/restart-dockerd.sh"; else echo "dockerd already running"; fi
    else
        bash "$here/restart-dockerd.sh"
    fi
fi

# --- 6. the background steps, then the test image into the engines --------------------------
step "CRIU and the test image's root (waiting for them)"
await criu
[ -z "${job_pid[image]:-}" ] || await image
step "test image"
ls -l "$image_tar"
if ! podman image exists localhost/gpuckpt-test:latest; then
    podman import --quiet --change 'CMD ["/bin/sh"]' "$image_tar" localhost/gpuckpt-test:latest >/dev/null
fi
if [ "$testbed" = full ] && ! "$docker" image inspect gpuckpt-test:latest >/dev/null 2>&1; then
    "$docker" import --change 'CMD ["/bin/sh"]' "$image_tar" gpuckpt-test:latest >/dev/null
fi

# --- 7. summary ------------------------------------------------------------------------------
step done
echo "== summary ($(( $(date +%s) - t0 )) s in all)"
echo "podman:   $(podman --version)"
[ "$testbed" = demo ] ||
    echo "docker:   $("$docker" version --format '{{.Server.Version}} (server), experimental={{.Server.Experimental}}')"
echo "runc:     $(runc --version | head -n1)"
echo "crun:     $(command -v crun) $(crun --version | head -n1) $(crun --version | tail -n1 | grep -o '+CRIU')"
echo "criu:     $(command -v criu) $(criu --version | head -n1)"
if [ -x /usr/sbin/criu ] && [ "$(command -v criu)" = /usr/local/sbin/criu ]; then
    echo "note:     /usr/sbin/criu ($(/usr/sbin/criu --version 2>/dev/null | head -n1)) is also installed; it fails" \
         "on this kernel: keep /usr/local/sbin before /usr/sbin in PATH"
fi
check=$(criu check 2>&1 | tail -n1 || true)  # a failure is reported below, with its last line
echo "criu check: $check"
if [ -x /usr/local/bin/checkpointctl ]; then echo "checkpointctl: /usr/local/bin/checkpointctl ($suite)"; fi
images="podman $(podman image inspect --format '{{.Id}}' localhost/gpuckpt-test:latest | cut -c1-12)"
[ "$testbed" = demo ] || images+=", docker $("$docker" image inspect --format '{{.Id}}' gpuckpt-test:latest | cut -c8-19)"
echo "images:   $images"
case $check in *"Looks good"*) ;; *) echo "install-system.sh: criu check failed" >&2; exit 1;; esac
