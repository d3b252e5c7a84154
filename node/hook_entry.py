"""How gpuckpt-hook appears in a container's spec: its stages, arguments and time limit.

Stdlib only: the runtime's `create` (shim/create.py) adds these entries without loading
pydantic; node/hooks_d.py builds the hooks.d files from the same values.
"""

from __future__ import annotations

import os

HOOK_NAME = "gpuckpt-hook"
STAGES = ("createRuntime", "poststop")  # a stage is the hook's one argument
# A limit for a hook that hangs, never for a busy node: with 50 containers starting at once on the
# 2-core CI VM (bench/load.py) the hook, ~15 ms alone, ran past a 10 s limit 4 times and the engine
# failed those containers' start.
HOOK_TIMEOUT_S = 60


def hook_beside(runtime_path: str) -> str:
    """gpuckpt-hook of the installation whose gpuckpt-runtime is at `runtime_path`: they are installed side by side."""
    return os.path.join(os.path.dirname(runtime_path), HOOK_NAME)


def spec_entry(hook_path: str, stage: str) -> dict[str, object]:
    """One entry of the spec's hooks.<stage> list (the OCI runtime spec's Hook)."""
    return {"path": hook_path, "args": [HOOK_NAME, stage], "timeout": HOOK_TIMEOUT_S}
