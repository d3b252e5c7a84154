"""A restore through crun that would kill every process on the node, refused before it starts.

crun's restore destroys the cgroup its proxy process finds itself in; when that is a cgroup v1
hierarchy's root (one not mounted where crun enters it, or one CRIU creates for the checkpoint's
cgroup image during the restore), crun kills every process on the node (host/cgroup_v1.py).
"""

from __future__ import annotations

import os

from ..host.cgroup_v1 import crun_restore_hazard
from ..oci.criu_images import directory_source, read_cgroup_hierarchies


def crun_restore_refusals(delegate: str, container_id: str, image_dir: str) -> list[str]:
    if not is_crun(delegate):
        return []
    if hazard := crun_restore_hazard(read_cgroup_hierarchies(directory_source(image_dir), image_dir)):
        return [f"restore of {container_id} refused: {hazard}, and crun's restore would kill every process in its "
                f"root (the whole node); mount or remove that hierarchy (gpuckpt doctor says how) or restore "
                f"through runc"]
    return []


def is_crun(delegate: str) -> bool:
    """The delegate is crun by its name or by the name of the file it links to (a crun the operator
    renamed and copied is not seen: asking each delegate's --version costs every restore a process)."""
    return any("crun" in os.path.basename(path) for path in (delegate, os.path.realpath(delegate)))
