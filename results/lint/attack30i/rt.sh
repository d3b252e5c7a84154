#!/bin/sh
# attack30i: gpuckpt-runtime under a trust directory of our own (restore:any there), the node's untouched
GPUCKPT_CONFIG=/var/tmp/attack30i/config.toml GPUCKPT_TRUST_DIR=/var/tmp/attack30i/trust GPUCKPT_TRUST_LOG=/var/tmp/attack30i/trust.log exec /usr/bin/gpuckpt-runtime "$@"
