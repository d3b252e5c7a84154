"""How gpuckpt-hook appears in a container's spec: its stages, arguments and time limit.

Stdlib only: the runtime's `create` (shim/create.py) adds these entries without loading
pydantic; oci/hooks_d.py builds the hooks.d files from the same values.
"""

from __future__ import annotations

import os

HOOK_NAME = "gpuckpt-hook"
STAGES = ("createRuntime", "poststop")  # a stage is the hook's one argument
HOOK_TIMEOUT_S = 10


def hook_beside(runtime_path: str) -> str:
    """gpuckpt-hook of the installation whose gpuckpt-runtime is at `runtime_path`: they are installed side by side."""
    return os.path.join(os.path.dirname(runtime_path), HOOK_NAME)


def spec_entry(hook_path: str, stage: str) -> dict[str, object]:
    """One entry of the spec's hooks.<stage> list (the OCI runtime spec's Hook)."""
    return {"path": hook_path, "args": [HOOK_NAME, stage], "timeout": HOOK_TIMEOUT_S}
