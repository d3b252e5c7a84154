#!/bin/bash
# attack30g: run.sh's modes under restore:any (node policy changed for the run only, put back after, cmp'd).
H=$(dirname "$(readlink -f "$0")")
cp /etc/gpuckpt/trust.toml /var/tmp/attack30g/trust.toml.before
bash $H/run.sh nosig   # control first: default policy
gpuckpt trust allow-unsigned restore:any --note attack30g
bash $H/run.sh ${@:-nosig procsysrw binfmt}
gpuckpt trust disallow-unsigned restore:any
cmp /etc/gpuckpt/trust.toml /var/tmp/attack30g/trust.toml.before && echo "trust policy put back: identical"
