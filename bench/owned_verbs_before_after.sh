#!/usr/bin/env bash
# bench/owned_verbs.py for two trees of gpuckpt in one run: BASE (a git revision, the "before") and this
# working tree (the "after"), each installed by its own packaging/install.sh into a private prefix, timed
# in turns (base, this, base, this) so the machine's load falls on both. Each round is owned_verbs.py's
# own run (runc beside the shim in the same round); the summary sets the shim's added milliseconds of
# both trees side by side. Writes results/bench/owned_verbs-before-after-<host>.json.
# Usage (root, after integration/testbed/setup.sh): bench/owned_verbs_before_after.sh BASE [CYCLES]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
base=${1:?give the git revision to compare against}
cycles=${2:-10}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"; systemctl start gpuckpt-runtimed.socket 2>/dev/null || true' EXIT
# Each tree's own gpuckpt-runtimed (owned_verbs.py starts the one beside the shim): systemd's socket, the
# .deb's helper, would take both trees' calls (and refuse them as another install's).
systemctl stop gpuckpt-runtimed.socket gpuckpt-runtimed.service 2>/dev/null || true
git -C "$repo" archive --format=tar --prefix=base/ "$base" | tar -C "$scratch" -xf -
mkdir -p "$scratch/this"
git -C "$repo" ls-files -z | (cd "$repo" && tar --null -T - -cf -) | tar -C "$scratch/this" -xf -
for tree in base this; do
    GPUCKPT_PREFIX="$scratch/$tree-prefix" GPUCKPT_BINDIR="$scratch/$tree-bin" GPUCKPT_EXTRAS=gpu \
        bash "$scratch/$tree/packaging/install.sh" >/dev/null
done
python="$scratch/this-prefix/venv/bin/python3"
for round in 1 2; do
    for tree in base this; do
        echo "== round $round: $tree"
        PATH="$scratch/$tree-bin:$PATH" "$python" "$repo/bench/owned_verbs.py" --cycles "$cycles" \
            --out "$scratch/$tree-$round.json"
    done
done
"$python" - "$scratch" "$base" "$(git -C "$repo" rev-parse --short HEAD)" "$repo/results/bench" <<'SUMMARY'
import json, platform, statistics, sys
from pathlib import Path
scratch, base, head, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
keys = ("checkpoint_added_ms", "restore_added_ms", "passthrough_added_ms",
        "checkpoint_added_in_process_ms", "restore_added_in_process_ms")
rounds = {tree: [json.loads((scratch / f"{tree}-{n}.json").read_text()) for n in (1, 2)] for tree in ("base", "this")}
summary = {"machine": rounds["this"][0].get("machine", platform.node()), "base": base, "this": head,
           "rounds": rounds, "added_ms_median_of_rounds": {}}
print(f"{'added ms (median of rounds)':36} {'before ' + base:>18} {'after ' + head:>18}")
for key in keys:
    values = {tree: statistics.median(r[key] for r in rounds[tree] if key in r) for tree in rounds
              if all(key in r for r in rounds[tree])}
    if len(values) == 2:
        summary["added_ms_median_of_rounds"][key] = values
        print(f"{key:36} {values['base']:>18.1f} {values['this']:>18.1f}")
path = out / f"owned_verbs-before-after-{platform.node()}.json"
path.write_text(json.dumps(summary, indent=1) + "\n")
print(f"written: {path}")
SUMMARY
