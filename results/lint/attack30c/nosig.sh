#!/bin/bash
# attack30c: G1 for an unsigned dump under restore:any (node policy changed for the run only, put back after).
H=$(dirname "$(readlink -f "$0")")
cp /etc/gpuckpt/trust.toml /var/tmp/attack30c/trust.toml.before
bash $H/run.sh hookenv-nosig   # control first: default policy
gpuckpt trust allow-unsigned restore:any --note attack30c
bash $H/run.sh hookenv-nosig rule-nosig
gpuckpt trust disallow-unsigned restore:any
cmp /etc/gpuckpt/trust.toml /var/tmp/attack30c/trust.toml.before && echo "trust policy put back: identical"
