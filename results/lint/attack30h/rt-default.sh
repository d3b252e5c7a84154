#!/bin/sh
# attack30h: gpuckpt-runtime under a trust directory of our own dtrust: the node key, no allow_unsigned (the default policy), the node's untouched
GPUCKPT_TRUST_DIR=/var/tmp/attack30h/dtrust GPUCKPT_TRUST_LOG=/var/tmp/attack30h/trust.log exec /usr/bin/gpuckpt-runtime "$@"
