#!/bin/sh
# attack30l: gpuckpt-runtime under a trust directory of our own (restore:any there), the node's untouched
GPUCKPT_CONFIG=/var/tmp/attack30l/config.toml GPUCKPT_TRUST_DIR=/var/tmp/attack30l/trust GPUCKPT_TRUST_LOG=/var/tmp/attack30l/trust.log exec /usr/bin/gpuckpt-runtime "$@"
