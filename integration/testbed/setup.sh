#!/usr/bin/env bash
# Set up a node (fresh Debian 12, root) for gpuckpt and its tests: the container test bed
# (install-system.sh), gpuckpt itself, and its registration with podman and docker.
#
# GPUCKPT_INSTALL=deb (the default): gpuckpt as operators get it, the .deb built from this tree
# (packaging/build.sh) and installed with apt: /usr/bin's commands, the packaged hooks.d, units and
# config. The tests' own tools (pytest, ruff, mypy, and gpuckpt's modules the unit tests import)
# live in /opt/gpuckpt/venv without launchers. GPUCKPT_INSTALL=tree: packaging/install.sh's
# launchers in /usr/local/bin run this tree (quick to redo while changing code; they come first
# in PATH, over the package's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mode=${GPUCKPT_INSTALL:-deb}
case $mode in deb|tree) ;; *) echo "setup.sh: GPUCKPT_INSTALL=$mode: give deb or tree" >&2; exit 2;; esac

[ "$(id -u)" = 0 ] || { echo "setup.sh: run as root" >&2; exit 1; }
start=$(date +%s)
bash "$here/install-system.sh"
bash "$here/containerd.sh"   # containerd 2.1 in a private prefix, for integration/test_cri.py
if [ "$mode" = deb ]; then
    GPUCKPT_EXTRAS=${GPUCKPT_EXTRAS:-gpu,test,cri-test} GPUCKPT_BINDIR=none bash "$repo/packaging/install.sh"
    # install.sh's launchers from an earlier tree install would come first in PATH: only ours go (the
    # scripts name the venv's interpreter in their first line, the compiled runtime launcher holds it)
    for name in gpuckpt gpuckpt-runtime gpuckpt-runtimed gpuckpt-hook gpuckptd; do
        launcher=/usr/local/bin/$name
        if [ -f "$launcher" ] && { head -n 1 "$launcher" | grep -qax '#!/opt/gpuckpt/venv/bin/python3 -IS' ||
                                   grep -qaF /opt/gpuckpt/venv/bin/python3 "$launcher"; }; then
            rm -f "$launcher"
        fi
    done
    dist=$(mktemp -d)
    GPUCKPT_LINTIAN=0 bash "$repo/packaging/build.sh" deb "$dist"  # lintian runs in the tests: test_packages.py's build
    # --force-confold: a node's own /etc/gpuckpt/config.toml stays as it is
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --reinstall -o Dpkg::Options::=--force-confold \
        "$dist"/gpuckpt_*.deb >/dev/null
    rm -rf "$dist"
    [ "$(command -v gpuckpt-runtime)" = /usr/bin/gpuckpt-runtime ] || {
        echo "setup.sh: gpuckpt-runtime in PATH is $(command -v gpuckpt-runtime), not the package's" >&2; exit 1; }
else
    GPUCKPT_EXTRAS=${GPUCKPT_EXTRAS:-gpu,test,cri-test} bash "$repo/packaging/install.sh"
fi
gpuckpt install --engine podman --default
gpuckpt install --engine docker
bash "$here/restart-dockerd.sh"   # dockerd reads "experimental" only at start
gpuckpt doctor
echo "setup.sh: node ready in $(( $(date +%s) - start )) s ($mode: $(command -v gpuckpt-runtime))"
