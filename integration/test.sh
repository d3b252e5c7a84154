#!/usr/bin/env bash
# The README's test command: set up the node, then run every test (unit + integration).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/integration/testbed/setup.sh" || exit 1
cd "$repo"
GPUCKPT_HOSTILE_TABLE=${GPUCKPT_HOSTILE_TABLE:-$repo/tests/hostile-inputs.md} /opt/gpuckpt/venv/bin/python3 -m pytest -p no:cacheprovider tests integration "$@"
status=$?
[ "$status" = 5 ] && { echo "test.sh: no tests collected" >&2; exit 1; }
exit "$status"
