#!/usr/bin/env bash
# containerd 2.1 for the CRI tests (integration/test_cri.py), as root, on the Debian 12 test machine:
# Debian forky's containerd package (containerd, containerd-shim-runc-v2, ctr) unpacked into a private
# prefix, /opt/gpuckpt/containerd, the way install-system.sh takes CRIU: a private apt state that the
# machine's own sources, preferences and dpkg status never see. Nothing is installed on the machine:
# bookworm's containerd 1.6 (docker's) stays /usr/bin/containerd. forky's binaries are Go programs that
# link only libc (>= 2.34): they run on bookworm's libc as they are. The test fixture starts its own
# containerd from the prefix (its own root, state, socket and config) and stops it after.
# Idempotent: a second run checks and prints the version.
#
# Environment: GPUCKPT_DEBIAN_MIRROR (default: the mirror of the existing apt sources),
#              GPUCKPT_CONTAINERD_PREFIX (default /opt/gpuckpt/containerd),
#              GPUCKPT_CONTAINERD_SUITE (default forky).
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "containerd.sh: run as root" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
prefix=${GPUCKPT_CONTAINERD_PREFIX:-/opt/gpuckpt/containerd}
suite=${GPUCKPT_CONTAINERD_SUITE:-forky}
state=/var/lib/gpuckpt-testbed/containerd-apt     # private apt state for this suite's download
cache=/var/cache/gpuckpt-testbed/containerd
layout="containerd=$suite"

if [ "$(cat "$prefix/.complete" 2>/dev/null)" = "$layout" ] && "$prefix/usr/bin/containerd" --version >/dev/null 2>&1; then
    echo "containerd.sh: $("$prefix/usr/bin/containerd" --version) in $prefix"
    exit 0
fi

. "$here/debian-mirror.sh"
mirror=${GPUCKPT_DEBIAN_MIRROR:-$(debian_mirror)}
mkdir -p "$state/etc/parts" "$state/etc/prefs" "$state/lists/partial" "$cache/apt/archives/partial" "$cache/debs"
cat >"$state/etc/newer.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
: >"$state/status.empty"
apt_private=(-o "Dir::Etc::SourceList=$state/etc/newer.sources" -o "Dir::Etc::SourceParts=$state/etc/parts"
             -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$state/etc/prefs"
             -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status.empty"
             -o "Dir::Cache=$cache/apt" -o "APT::Architecture=amd64" -o "APT::Architectures::=amd64"
             -o "APT::Sandbox::User=root")
apt-get "${apt_private[@]}" update -q
# Only the containerd package: its Depends are libc6 (>= 2.34, bookworm has 2.36) and runc, which
# the test bed has (gpuckpt-runtime is the runtime the tests give it anyway).
(cd "$cache/debs" && rm -f ./*.deb && apt-get "${apt_private[@]}" download -q "containerd/$suite")
rm -rf "$prefix.new"
mkdir -p "$prefix.new"
dpkg-deb -x "$cache"/debs/containerd_*.deb "$prefix.new"
rm -rf "$prefix.new"/usr/share/{doc,man,lintian} "$prefix.new"/usr/lib/systemd
"$prefix.new/usr/bin/containerd" --version | grep -q ' v\?2\.' ||
    { echo "containerd.sh: $suite's containerd is not 2.x: $("$prefix.new/usr/bin/containerd" --version)" >&2; exit 1; }
echo "$layout" >"$prefix.new/.complete"
rm -rf "$prefix.old"
[ ! -e "$prefix" ] || mv "$prefix" "$prefix.old"
mv "$prefix.new" "$prefix"
rm -rf "$prefix.old"
echo "containerd.sh: $("$prefix/usr/bin/containerd" --version) in $prefix"
