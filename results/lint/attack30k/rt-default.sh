#!/bin/sh
# attack30k: gpuckpt-runtime under a trust directory of our own dtrust: the node key, no allow_unsigned (the default policy), the node's untouched
GPUCKPT_CONFIG=/var/tmp/attack30k/config.toml GPUCKPT_TRUST_DIR=/var/tmp/attack30k/dtrust GPUCKPT_TRUST_LOG=/var/tmp/attack30k/trust.log exec /usr/bin/gpuckpt-runtime "$@"
