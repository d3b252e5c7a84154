"""Where podman keeps its containers on this node (its graph root, and its run root with their pid files), and
where an import stages beside them.

One `podman info` call gives both: it gathers every host fact first (0.8-1.7 s on the CI VM, the slowest step
before an import's checks), so it is asked once, and only after the refusals that need no storage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..host.process import run
from ..host.programs import CommandError


@dataclass(frozen=True)
class PodmanStorage:
    graph_root: str  # containers' storage (/var/lib/containers/storage)
    run_root: str  # their run-time files, conmon's pid files among them (/run/containers/storage)

    @property
    def staging_parent(self) -> str:
        """Beside the storage, on its filesystem, so the shim can rename staged pages in (a copy otherwise); in
        it when the storage is a filesystem of its own."""
        near = os.path.dirname(self.graph_root)
        return self.graph_root if os.stat(near).st_dev != os.stat(self.graph_root).st_dev else near


def podman_storage(podman: str) -> PodmanStorage:
    """podman's graph root and run root, from one `podman info`."""
    shown = run([podman, "info", "--format", "{{.Store.GraphRoot}}\n{{.Store.RunRoot}}"]).stdout.split("\n")
    roots = [line.strip() for line in shown if line.strip()]
    if len(roots) != 2 or not all(os.path.isabs(root) for root in roots):
        raise CommandError(f"{podman} info named no graph root and run root (it printed {' '.join(roots)[:120]!r})")
    return PodmanStorage(graph_root=roots[0], run_root=roots[1])
