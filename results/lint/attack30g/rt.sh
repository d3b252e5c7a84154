#!/bin/sh
# attack30g: gpuckpt-runtime under a trust directory of our own (restore:any there), the node's untouched
GPUCKPT_TRUST_DIR=/var/tmp/attack30g/trust GPUCKPT_TRUST_LOG=/var/tmp/attack30g/trust.log exec /usr/bin/gpuckpt-runtime "$@"
