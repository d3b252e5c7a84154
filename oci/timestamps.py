"""The one timestamp form every record gpuckpt writes carries: UTC, to the second, RFC 3339 with Z
(manifests, suspension records, signatures, image annotations, the trust policy and its log)."""

from __future__ import annotations

import time


def utc_now() -> str:
    """Now, as "2026-11-23T17:00:04Z"."""
    return utc_at(time.time())


def utc_at(epoch_s: float) -> str:
    """A time (seconds since the epoch) in the same form."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))
