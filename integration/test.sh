#!/usr/bin/env bash
# The README's test command: set up the node, then run every test (unit + integration).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# The engine tests again against Debian forky's engines (podman 5.8, runc 1.3, crun 1.28, CRIU 4.2, docker 28), in
# an isolated forky root (integration/forky/run.sh). GPUCKPT_FORKY=after (the default) runs that set after the main
# one; parallel runs it beside the main one, its output printed at the end: its own mount, network and PID
# namespaces, the kernel and the cgroup hierarchies shared (.ci/run does so: the main set waits on containers much
# of its time, which leaves the forky set the second core of CI's two); 0 leaves it out.
forky_mode=${GPUCKPT_FORKY:-after}
case $forky_mode in
    after|parallel|0) ;;
    1) forky_mode=after;;   # the earlier spelling
    *) echo "test.sh: GPUCKPT_FORKY=$forky_mode: give after, parallel or 0" >&2; exit 2;;
esac
bash "$repo/integration/testbed/setup.sh" || exit 1
cd "$repo"
# Lint, the import contracts and types first: a failure here costs seconds, not the suite's minutes.
bash "$repo/integration/lint.sh" || exit 1
if [ "$forky_mode" = parallel ]; then
    forky_log=$(mktemp /tmp/gpuckpt-forky-XXXXXX.log)
    # a session of its own: a background job ignores Ctrl-C, so an interrupted run ends it by its group
    setsid bash "$repo/integration/forky/run.sh" >"$forky_log" 2>&1 </dev/null &
    forky_pid=$!
    trap 'kill -TERM -- "-$forky_pid" 2>/dev/null; exit 130' INT TERM
    echo "test.sh: the forky engine set runs beside the main set (pid $forky_pid; its output, $forky_log, comes at the end)"
fi
GPUCKPT_HOSTILE_TABLE=${GPUCKPT_HOSTILE_TABLE:-$repo/tests/hostile-inputs.md} \
    GPUCKPT_FAULT_TABLE=${GPUCKPT_FAULT_TABLE:-$repo/integration/fault-outcomes.md} /opt/gpuckpt/venv/bin/python3 -m pytest -p no:cacheprovider --durations=40 tests integration "$@"
status=$?
if [ "$status" = 5 ]; then
    echo "test.sh: no tests collected" >&2
    status=1
    [ "$forky_mode" != after ] || exit 1
fi
forky=0
case $forky_mode in
    parallel)
        wait "$forky_pid"; forky=$?
        trap - INT TERM
        echo "test.sh: ================ the forky engine set, run beside the main set ================"
        cat "$forky_log"; rm -f "$forky_log";;
    after) bash "$repo/integration/forky/run.sh"; forky=$?;;
esac
[ "$forky" = 0 ] || [ "$forky_mode" = 0 ] || echo "test.sh: the forky engine set failed (status $forky)" >&2
[ "$status" != 0 ] || status=$forky
exit "$status"
