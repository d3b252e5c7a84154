#!/usr/bin/env bash
# Set up a node (fresh Debian 12, root) for gpuckpt and its tests: the container test bed
# (install-system.sh), gpuckpt itself, and its registration with podman and docker.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

[ "$(id -u)" = 0 ] || { echo "setup.sh: run as root" >&2; exit 1; }
start=$(date +%s)
bash "$here/install-system.sh"
GPUCKPT_EXTRAS=${GPUCKPT_EXTRAS:-gpu,test} bash "$repo/packaging/install.sh"
gpuckpt install --engine podman --default
gpuckpt install --engine docker
bash "$here/restart-dockerd.sh"   # dockerd reads "experimental" only at start
gpuckpt doctor
echo "setup.sh: node ready in $(( $(date +%s) - start )) s"
