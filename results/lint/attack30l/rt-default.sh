#!/bin/sh
# attack30l: gpuckpt-runtime under a trust directory of our own dtrust: the node key, no allow_unsigned (the default policy), the node's untouched
GPUCKPT_CONFIG=/var/tmp/attack30l/config.toml GPUCKPT_TRUST_DIR=/var/tmp/attack30l/dtrust GPUCKPT_TRUST_LOG=/var/tmp/attack30l/trust.log exec /usr/bin/gpuckpt-runtime "$@"
