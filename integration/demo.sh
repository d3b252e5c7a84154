#!/usr/bin/env bash
# The README's main job: set up the node, then checkpoint and restore a stateful container
# through gpuckpt-runtime, showing that it continues from its checkpointed state.
# With an NVIDIA GPU present, the GPU scenarios run too (pytest -m gpu integration/gpu).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/integration/testbed/setup.sh"

bash "$repo/integration/demo-steps.sh"

if [ -e /dev/nvidia0 ]; then
    echo "== NVIDIA GPU present: running the GPU scenarios"
    (cd "$repo" && python3 -m pytest -p no:cacheprovider --confcutdir=integration/gpu -m gpu integration/gpu \
        --gpu-results "${OUT:-/tmp}")
fi
