#!/usr/bin/env bash
# The README's test command: set up the node, then run every test (unit + integration).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/integration/testbed/setup.sh" || exit 1
cd "$repo"
# Lint, the import contracts and types first: a failure here costs seconds, not the suite's minutes.
bash "$repo/integration/lint.sh" || exit 1
GPUCKPT_HOSTILE_TABLE=${GPUCKPT_HOSTILE_TABLE:-$repo/tests/hostile-inputs.md} \
    GPUCKPT_FAULT_TABLE=${GPUCKPT_FAULT_TABLE:-$repo/integration/fault-outcomes.md} /opt/gpuckpt/venv/bin/python3 -m pytest -p no:cacheprovider --durations=40 tests integration "$@"
status=$?
[ "$status" = 5 ] && { echo "test.sh: no tests collected" >&2; exit 1; }
# The engine tests again against Debian forky's engines (podman 5.8, runc 1.3, crun 1.28), in an
# isolated forky root (integration/forky/run.sh; GPUCKPT_FORKY=0 leaves them out).
if [ "${GPUCKPT_FORKY:-1}" != 0 ]; then
    bash "$repo/integration/forky/run.sh"
    forky=$?
    [ "$forky" = 0 ] || { echo "test.sh: the forky engine set failed (status $forky)" >&2; [ "$status" != 0 ] || status=$forky; }
fi
exit "$status"
