#!/bin/sh
# attack30h: gpuckpt-runtime under a trust directory of our own (restore:any there), the node's untouched
GPUCKPT_TRUST_DIR=/var/tmp/attack30h/trust GPUCKPT_TRUST_LOG=/var/tmp/attack30h/trust.log exec /usr/bin/gpuckpt-runtime "$@"
