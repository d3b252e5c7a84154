#!/usr/bin/env bash
# The engine integration tests against Debian forky's engine set (podman 5.8, runc 1.3, crun 1.28,
# CRIU 4.2, docker 28.5 with containerd 2.1), in the isolated forky root (../testbed/forky-root.sh builds it, ../testbed/in-forky.sh
# enters it). Run as root on a machine set up by ../testbed/setup.sh (or install-system.sh):
#
#   bash integration/forky/run.sh [PYTEST ARG...]
#
# Extra arguments go to pytest (e.g. -x, -k NAME, or test files under integration/ to run only
# those). The exit status is pytest's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
testbed=$(cd "$here/../testbed" && pwd)
start=$(date +%s)
bash "$testbed/forky-root.sh"
set +e
bash "$testbed/in-forky.sh" -- bash /src/gpuckpt/integration/forky/inside.sh "$@"
status=$?
echo "forky/run.sh: forky engine set done in $(( $(date +%s) - start )) s, status $status"
exit "$status"
