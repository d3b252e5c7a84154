"""gpuckpt-hook's place in a container's life: the OCI spec's hook entries and the hooks.d files
(schema 1.0.0, read by podman and CRI-O from /usr/share/containers/oci/hooks.d and
/etc/containers/oci/hooks.d; a file in /etc replaces one of the same name in /usr/share).

hooks.d has no condition on devices, so the files fire for every container ("always") and the
hook itself returns at once for a container given no NVIDIA GPU. docker and containerd read no
hooks.d: there the runtime adds the same entries to the spec on `create` (shim/create.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .hook_entry import STAGES, spec_entry

PACKAGED_HOOK_PATH = "/usr/bin/gpuckpt-hook"  # where the packages put it (hooks/oci-hooks.d/ names this path)
PACKAGED_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"  # where the packages put hooks/oci-hooks.d/
HookStage = Literal["createRuntime", "poststop"]
HOOKS_D_FILE = "gpuckpt-{stage}.json"  # one file per stage: a stage is the hook's one argument


class SpecHook(BaseModel):
    """One entry of the OCI spec's hooks.<stage> list."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(pattern=r"^/")
    args: list[str] = []
    env: list[str] = []
    timeout: int | None = Field(default=None, ge=1)


class HookCondition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    always: bool = True


class HooksDFile(BaseModel):
    """A hooks.d JSON file, schema 1.0.0."""

    model_config = ConfigDict(extra="forbid")
    version: Literal["1.0.0"] = "1.0.0"
    hook: SpecHook
    when: HookCondition = HookCondition()
    stages: list[HookStage]


def hooks_d_file(hook_path: str, stage: str, env: list[str] | None = None) -> HooksDFile:
    """The hooks.d file running the hook at `hook_path` at `stage` (with `env`, for tests) for every container."""
    return HooksDFile.model_validate({"hook": {**spec_entry(hook_path, stage), "env": env or []}, "stages": [stage]})


def hooks_d_files(hook_path: str) -> dict[str, str]:
    """The hooks.d files for a hook at `hook_path`: file name -> JSON text."""
    return {HOOKS_D_FILE.format(stage=stage.lower()): hooks_d_file(hook_path, stage).model_dump_json(indent=2) + "\n"
            for stage in STAGES}


def only_gpuckpt_hooks(hooks: dict[str, object], hook_paths: frozenset[str]) -> bool:
    """Whether a spec's hooks are exactly the entries gpuckpt adds for a hook at one of `hook_paths`
    (this node's own): podman writes them into every container's spec.dump, so an archive of this
    node, or of a node with the hook where this node has it, carries them and nothing more."""
    return all(stage in STAGES and isinstance(entries, list)
               and all(isinstance(entry, dict) and {**entry, "env": entry.get("env", [])}
                       in ({**spec_entry(path, stage), "env": []} for path in hook_paths) for entry in entries)
               for stage, entries in hooks.items())
