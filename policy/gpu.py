"""What the GPU side of a checkpoint refuses, judged from plain data before anything is locked.

The verbs gather the facts (the driver's and /proc's answers) and raise or log what these return;
policy never calls the driver (it sits beside cuda/, not above it).
"""

from __future__ import annotations

from collections.abc import Mapping


def pre_dump_refusals(pre_dump: bool) -> list[str]:
    """A pre-dump copies memory that changes later again; the GPU's device memory has no such tracking."""
    if not pre_dump:
        return []
    return ["--pre-dump is not supported for GPU containers: device memory has no dirty tracking"]


def unrestorable_refusals(container_id: str, reasons: Mapping[int, str | None], allowed: bool) -> list[str]:
    """Each CUDA process the driver could checkpoint but never restore (`reasons`, by pid), refused unless the
    operator allows it (then the caller warns with the reason itself)."""
    if allowed:
        return []
    return [f"checkpoint of {container_id} refused: {reason}" for _, reason in sorted(reasons.items()) if reason]
