"""Whom this node trusts: its signing key and trust policy, the signature envelope, the signatures of
dumps and archives, and the provenance an exported checkpoint carries."""
