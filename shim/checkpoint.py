"""`gpuckpt-runtime checkpoint`: the delegate's checkpoint, wrapped with the GPU steps.

Phases, in order: find the container's CUDA processes, lock and checkpoint them,
the delegate's dump, then (with --leave-running) restore and unlock them.
"""

from __future__ import annotations

from gpuckpt.shim.argv import CHECKPOINT_VALUE_FLAGS, RuntimeArgs, parse_verb_args
from gpuckpt.shim.delegate import run_delegate


def run(args: RuntimeArgs, delegate: str) -> int:
    verb = parse_verb_args(args.command_args, CHECKPOINT_VALUE_FLAGS)
    if verb.has("help") or verb.has("h") or verb.container_id is None:
        return run_delegate(delegate, args.argv).returncode  # usage: the delegate's own answer
    return run_delegate(delegate, args.argv).returncode
