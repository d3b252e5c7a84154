#!/usr/bin/env bash
# The README's main job: set up what it needs, then checkpoint and restore a stateful container
# through gpuckpt-runtime, showing that it continues from its checkpointed state.
# With an NVIDIA GPU present, the GPU scenarios run too (pytest -m gpu integration/gpu).
#
# Phases, each timed ("demo.sh: STEP took N s", then the total): the demo's container set-up
# (testbed/install-system.sh with GPUCKPT_TESTBED=demo: podman, runc, crun and CRIU 4.2, the test
# image; no docker) and, beside it, gpuckpt from this tree (packaging/install.sh: /opt/gpuckpt/venv,
# launchers in /usr/local/bin); the runtime registered with podman (the default); gpuckpt doctor;
# the container steps (demo-steps.sh). What only the tests need stays in the test command
# (testbed/setup.sh, run by integration/test.sh): docker and its engines' image, the .deb and its
# lintian, containerd 2.1, the tests' tools, forky's engines.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
testbed=$repo/integration/testbed
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root" >&2; exit 1; }

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
start=$(now)
timed() {  # STEP COMMAND...: run it, then say how long it took
    local step=$1 step_start; shift
    step_start=$(now)
    "$@"
    echo "demo.sh: $step took $(since "$step_start") s"
}

# gpuckpt's install (packaging/install.sh) fetches its wheels from PyPI while install-system.sh's time
# goes to the Debian mirror and debootstrap. The order: on a node that has it already (a second
# run), it comes first: podman may run gpuckpt-runtime as its default, and install-system.sh's podman
# calls must not meet it half-installed; on a fresh machine that has python3-venv and the launcher's
# compiler, it runs beside install-system.sh, its output held until it ends; on a bare one, after it.
install_log=$(mktemp)
install_status=$(mktemp)
# On a failure elsewhere the install still ends before the demo does: nothing half-written is left running.
trap '[ -z "${install_pid:-}" ] || wait "$install_pid" 2>/dev/null || true; rm -f "$install_log" "$install_status"' EXIT
install_gpuckpt() {
    local step_start; step_start=$(now)
    if bash "$repo/packaging/install.sh" >"$install_log" 2>&1; then
        echo "demo.sh: gpuckpt from this tree (packaging/install.sh) took $(since "$step_start") s" >>"$install_log"
    else
        echo "$?" >"$install_status"
    fi
}
show_install() {
    echo "== gpuckpt from this tree (packaging/install.sh)"
    cat "$install_log"
    [ ! -s "$install_status" ] || { echo "demo.sh: packaging/install.sh failed (status $(cat "$install_status"))" >&2; exit 1; }
}
test_bed() { timed "the container set-up (testbed/install-system.sh, demo)" env GPUCKPT_TESTBED=demo bash "$testbed/install-system.sh"; }
order=beside
for package in python3-venv gcc libc6-dev zlib1g-dev; do
    dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q '^install ok installed$' || order=after
done
[ ! -e /usr/local/bin/gpuckpt-runtime ] || order=first
case $order in
    first) install_gpuckpt; show_install; test_bed;;
    beside)
        echo "== gpuckpt from this tree (packaging/install.sh), beside the container set-up"
        install_gpuckpt &
        install_pid=$!
        test_bed
        wait "$install_pid"
        show_install;;
    after) test_bed; install_gpuckpt; show_install;;
esac

echo "== gpuckpt-runtime registered with podman (the default)"
# podman: the container steps run through it. docker only where it was installed before (the demo's
# set-up has none): gpuckpt doctor checks every engine it finds.
register() {
    gpuckpt install --engine podman --default
    if command -v dockerd >/dev/null; then gpuckpt install --engine docker; fi
}
timed "registering the runtime" register
echo "== gpuckpt doctor"
timed "gpuckpt doctor" gpuckpt doctor
echo "demo.sh: node ready in $(since "$start") s ($(command -v gpuckpt-runtime))"

timed "the container steps (demo-steps.sh)" bash "$repo/integration/demo-steps.sh"

if [ -e /dev/nvidia0 ]; then
    echo "== NVIDIA GPU present: running the GPU scenarios"
    gpu_scenarios() {
        (cd "$repo" && python3 -m pytest -p no:cacheprovider --confcutdir=integration/gpu -m gpu integration/gpu \
            --gpu-results "${OUT:-/tmp}")
    }
    timed "the GPU scenarios" gpu_scenarios
fi
echo "demo.sh: done in $(since "$start") s"
