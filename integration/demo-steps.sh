#!/usr/bin/env bash
# The demo's container steps on a node where gpuckpt is installed and registered with podman:
# a stateful container checkpointed and restored through gpuckpt-runtime, then moved as an
# archive (gpuckpt export, removed, gpuckpt import), each time shown to continue from its
# checkpointed state. integration/demo.sh runs it after setting the node up; the forky engine set
# (integration/forky/inside.sh) runs it on Debian forky's podman 5.8.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

name=gpuckpt-demo-$$
image=localhost/gpuckpt-test:latest
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
state() { podman exec "$name" cat /tmp/state; }
archive=/var/tmp/$name.tar.zst
trap 'podman rm -f -t 0 "$name" >/dev/null 2>&1 || true; rm -f "$archive" "$archive.sig"' EXIT
ticked_past() {  # STATE: wait (10 s at most) until the counter has gone past STATE's: the restored process runs on
    local count tries=0
    read -r _ count _ <<<"$1"
    until state 2>/dev/null | awk -v n="$count" '{exit !($2 > n)}'; do
        tries=$((tries + 1)); [ "$tries" -lt 50 ] || return 0  # continues() then says what is wrong
        sleep 0.2
    done
}
continues() {  # before after: same token and checksum, counter further on
    read -r token_before count_before sum_before <<<"$1"
    read -r token_after count_after sum_after <<<"$2"
    if [ "$token_after" = "$token_before" ] && [ "$count_after" -gt "$count_before" ] && [ "$sum_after" = "$sum_before" ]; then
        echo "== OK: the restored process is the checkpointed one (same token and checksum), counter went on $count_before -> $count_after"
    else
        echo "== FAILED: the workload did not continue from its checkpointed state" >&2; exit 1
    fi
}

echo "== starting a stateful container (a counter and a 16 MiB buffer with its checksum) through gpuckpt-runtime"
podman run -d --name "$name" --runtime gpuckpt-runtime --network none "$image" \
    python3 -c "$(cat "$repo/integration/workloads/counter.py")" >/dev/null
until state 2>/dev/null | awk '{exit !($2 >= 10)}'; do sleep 0.2; done
before=$(state); echo "   state before checkpoint: $before"

t=$(now); podman container checkpoint "$name" >/dev/null
echo "== checkpointed in $(elapsed "$t") s; status: $(podman inspect -f '{{.State.Status}}' "$name")"
t=$(now); podman container restore "$name" >/dev/null
echo "== restored in $(elapsed "$t") s; status: $(podman inspect -f '{{.State.Status}}' "$name")"
at_restore=$(state); ticked_past "$at_restore"
after=$(state); echo "   state after restore:     $after"

continues "$before" "$after"

echo "== moving it as an archive: gpuckpt export (podman's format, multithreaded zstd), container removed, gpuckpt import"
before=$(state)
t=$(now); gpuckpt export "$name" -o "$archive" >/dev/null
echo "   exported in $(elapsed "$t") s: $(du -h "$archive" | cut -f1), mode $(stat -c %a "$archive")"
echo "   $(gpuckpt trust verify "$archive")"
podman rm -f -t 0 "$name" >/dev/null
t=$(now); gpuckpt import "$archive" >/dev/null
echo "   imported and restored in $(elapsed "$t") s; status: $(podman inspect -f '{{.State.Status}}' "$name")"
at_restore=$(state); ticked_past "$at_restore"
after=$(state); echo "   state after import:      $after"
continues "$before" "$after"
