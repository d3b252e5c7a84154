#!/usr/bin/env bash
# The static checks, seconds where the suite takes minutes: ruff, the import contracts (pyproject.toml's
# [tool.importlinter]: the layers) and mypy. The contracts and mypy read the package as pip installs it:
# the tree installed (no dependencies) into a scratch folder, where it is `gpuckpt` whatever this clone's
# folder is called; what they report names the tree's own paths.
# Usage: lint.sh [PYTHON] (default: the test bed's venv, which has the tools and the dependencies).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${1:-/opt/gpuckpt/venv/bin/python3}
bin=$(dirname "$python")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$repo"
"$bin/ruff" check --no-cache . || { echo "lint.sh: ruff found problems" >&2; exit 1; }
# a copy first: setuptools' build/ in the tree would keep files of modules that have since moved
tar -C "$repo" --exclude=./.git --exclude=./build --exclude='./*.egg-info' --exclude='./.carry*' \
    --exclude='./.gpusnap*' --exclude='__pycache__' -cf - . | tar -C "$scratch" --one-top-level=src -xf - || exit 1
"$python" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$scratch/typed" \
    "$scratch/src" || exit 1
PYTHONPATH="$scratch/typed" "$bin/lint-imports" --no-cache --config "$repo/pyproject.toml" 2>&1 |
    sed -n '/^Contracts$/,$p' | sed "s#$scratch/typed/gpuckpt/##g"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "lint.sh: an import runs against the layers (pyproject.toml [tool.importlinter])" >&2; exit 1; }
MYPYPATH="$scratch/typed" "$python" -m mypy --config-file "$repo/pyproject.toml" --cache-dir "$scratch/cache" 2>&1 |
    sed "s#$scratch/typed/gpuckpt/##g"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "lint.sh: mypy found problems" >&2; exit 1; }
