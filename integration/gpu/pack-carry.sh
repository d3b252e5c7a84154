#!/usr/bin/env bash
# Everything the GPU machine lacks, packed into one .carry.tar.xz (an ignored path, carried
# by the device tool: 64 MiB in all): runc and CRIU with its libraries, the wheels gpuckpt
# needs for the machine's Python 3.12, and Debian's docker engine or podman (both do not fit
# in one call). harness.install() unpacks it there into .carry/. Run as root after
# integration/testbed/setup.sh.   Usage: pack-carry.sh [docker|docker28|podman|containerd|none]   (default docker;
# none: runc and CRIU only, for the runc-level scenarios; containerd: containerd 2.1 and the CRI client's
# grpcio-tools, for cri_gpu.py; docker28: what `none` packs, and beside it .carry-docker28.tar.xz, the forky
# root's docker 28.5 + containerd 2.1 ($GPUCKPT_FORKY_ROOT, default the test bed's) for test_docker28_gpu.py with
# --inject cdi: ~45 MiB, too much with the rest in one call, so a first call carries it alone and unpacks it
# into .carry-docker28, which the warm machine keeps for the next call, carrying .carry.tar.xz). `--inject cdi` needs nothing more here: conftest.py's install writes the CDI
# spec (cdi.py) and builds the self-contained image (image.py) there, from the machine's own driver and torch.
set -euo pipefail
engine=${1:-docker}
case $engine in docker|docker28|podman|containerd|none) ;; *) echo "usage: $0 [docker|docker28|podman|containerd|none]" >&2; exit 2;; esac
cd "$(dirname "$0")/../.."
rm -rf .carry .carry.tar.xz
bash integration/testbed/bundle-criu.sh .carry
case $engine in
    none) ;;
    docker28)
        rm -rf .carry-docker28 .carry-docker28.tar.xz
        bash integration/testbed/bundle-docker.sh .carry-docker28 "${GPUCKPT_FORKY_ROOT:-/var/cache/gpuckpt-testbed/forky/root}"
        tar -C .carry-docker28 -cf - . | xz -T0 -6 >.carry-docker28.tar.xz
        rm -rf .carry-docker28
        size=$(stat -c %s .carry-docker28.tar.xz)
        echo "pack-carry.sh: .carry-docker28.tar.xz $((size >> 20)) MiB (a call of its own)"
        [ "$size" -lt $((60 << 20)) ] || { echo "pack-carry.sh: docker 28 alone is over the device tool's 64 MiB" >&2; exit 1; };;
    *) bash "integration/testbed/bundle-$engine.sh" .carry;;
esac
/opt/gpuckpt/venv/bin/python -m pip download -q --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .carry/wheels \
    pydantic pyroute2 zstandard cryptography protobuf tomlkit tqdm blake3 pyfastcdc safetensors nvidia-ml-py \
    $([ "$engine" = containerd ] && echo grpcio grpcio-tools)
# python-systemd (gpuckptd) has no wheel on PyPI: built here for Python 3.12 (pyenv's, against
# Debian's libsystemd-dev; the machine has libsystemd.so.0)
py312=$(ls -d /root/.pyenv/versions/3.12*/bin/python3 2>/dev/null | head -1)
if [ -n "$py312" ]; then
    "$py312" -m pip wheel -q --no-deps -w .carry/wheels systemd-python
else
    echo "pack-carry.sh: no Python 3.12 here to build python-systemd's wheel: gpuckptd will not start there" >&2
fi
# gpuckpt-runtime's compiled launcher for the machine's paths (harness.py's TORCH_PYTHON and SITE; Ubuntu
# 24.04's glibc is newer than Debian 12's): pass-through and the hand-over to gpuckpt-runtimed without an
# interpreter, as the packages install it
bash shim/resident/build.sh .carry/bin/gpuckpt-runtime-compiled /opt/torch/.venv/bin/python3 /tmp/gpuckpt-site
# CRIU's message definitions for the shim's image checks (pure Python, from Debian's python3-pycriu)
cp -r /opt/gpuckpt/criu/usr/lib/python3/dist-packages/pycriu .carry/pycriu
# GPUCKPT_CARRY_PEER=1: the peer of bench_engine.py's `peer` mode, CRIU's CUDA plugin (built for the
# carried CRIU) and NVIDIA's cuda-checkpoint, which its licence lets us use but not ship: taken from a
# fetched github:NVIDIA/cuda-checkpoint into the pack for the run only, never into the tree or a package.
if [ "${GPUCKPT_CARRY_PEER:-0}" = 1 ]; then
    plugin=${GPUCKPT_CUDA_PLUGIN_DIR:-/var/cache/gpuckpt-testbed/criu-cuda-plugin/out}
    [ -f "$plugin/cuda_plugin.so" ] || bash integration/testbed/build-criu-cuda-plugin.sh "$plugin"
    mkdir -p .carry/criu-plugins
    cp "$plugin/cuda_plugin.so" "$plugin/BUILT-FOR" .carry/criu-plugins/
    nvgit=${GPUCKPT_CUDA_CHECKPOINT_GIT:-/work/.mirror/NVIDIA+cuda-checkpoint/repo}
    git --git-dir="$nvgit" show HEAD:bin/x86_64_Linux/cuda-checkpoint >.carry/bin/cuda-checkpoint ||
        { echo "pack-carry.sh: no cuda-checkpoint in $nvgit (fetch github:NVIDIA/cuda-checkpoint)" >&2; exit 1; }
    chmod 0755 .carry/bin/cuda-checkpoint
fi
tar -C .carry -cf - . | xz -T0 -6 >.carry.tar.xz
size=$(stat -c %s .carry.tar.xz)
echo "pack-carry.sh: .carry.tar.xz $((size >> 20)) MiB"
[ "$size" -lt $((60 << 20)) ] || { echo "pack-carry.sh: over the device tool's 64 MiB with the tree" >&2; exit 1; }
