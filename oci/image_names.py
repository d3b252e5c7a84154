"""Names of gpuckpt's own files in a checkpoint's image directory (checkpoint/ in podman's archive). Stdlib
only: the shim's staging and the dump signature read them on every checkpoint, without the archive's
compressors (oci/podman_archive.py)."""

from __future__ import annotations

import re

STAGING_PLACEHOLDER = "gpuckpt-import.json"  # an import's placeholder, written where the staged pages go
PAGES_FILE = re.compile(r"pages-[0-9]{1,9}\.img")  # CRIU's page files: what an import stages itself
