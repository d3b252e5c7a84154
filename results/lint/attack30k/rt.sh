#!/bin/sh
# attack30k: gpuckpt-runtime under a trust directory of our own (restore:any there), the node's untouched
GPUCKPT_CONFIG=/var/tmp/attack30k/config.toml GPUCKPT_TRUST_DIR=/var/tmp/attack30k/trust GPUCKPT_TRUST_LOG=/var/tmp/attack30k/trust.log exec /usr/bin/gpuckpt-runtime "$@"
