#!/usr/bin/env bash
# Where a --leave-running checkpoint's restored copy resumes, through plain runc and through
# gpuckpt-runtime, side by side (issue #19: "the counter stepped back, 17 then 16").
# A counter container is checkpointed with --leave-running --export; the original runs on
# for 2 s, is removed, and the archive is imported: the copy resumes from the checkpoint's
# moment, not from where the original had got to. Root, podman, the test image (setup.sh).
# Usage: bench/leave_running_state.sh [RESULT_FILE]
set -euo pipefail
out=${1:-/dev/stdout}
image=localhost/gpuckpt-test
one() {  # RUNTIME
    local rt=$1 name archive before after later restored
    name=gpuckpt-leave-running-$(basename "$rt")-$$
    archive=$(mktemp --suffix=.tar.gz)
    podman run -d --runtime "$rt" --name "$name" --network none "$image" \
        sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/state; sleep 0.5; done' >/dev/null
    sleep 3
    before=$(podman exec "$name" cat /tmp/state)
    podman container checkpoint --leave-running --export "$archive" "$name" >/dev/null
    after=$(podman exec "$name" cat /tmp/state)
    sleep 2
    later=$(podman exec "$name" cat /tmp/state)
    podman rm -f -t 0 "$name" >/dev/null
    podman container restore --import "$archive" >/dev/null
    restored=$(podman exec "$name" cat /tmp/state)
    podman rm -f -t 0 "$name" >/dev/null
    rm -f "$archive"
    printf '%-16s read before the checkpoint %3s, after it %3s, the original 2 s later %3s, the restored copy %3s\n' \
        "$(basename "$rt")" "$before" "$after" "$later" "$restored"
}
{
    echo "# $(date -u +%FT%TZ) $(uname -n), podman $(podman version -f '{{.Client.Version}}')"
    one "$(command -v runc)"
    one gpuckpt-runtime
} | tee "$out"
