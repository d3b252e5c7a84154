"""`gpuckpt-runtime`: runc's command line; owned verbs here, the rest exec'd unchanged.

This module is on the path of every container operation: it imports only the
argv parser and the pass-through (shim/resolve.py) until it knows the verb is one it
owns; the imports inside functions below are that dispatch, deferred on purpose.
"""

from __future__ import annotations

import os
import sys

from gpuckpt import __version__
from gpuckpt.errors import GpuckptError
from gpuckpt.shim.argv import (
    RESTORE_VALUE_FLAGS,
    RuntimeArgs,
    hidden_checkpoint_or_restore,
    owned_verb_is_only_asked_about,
    parse_runtime_args,
)
from gpuckpt.shim.resolve import exec_delegate, resolve_runtime

TYPE_CHECKING = False  # typing's own flag costs an import on the pass-through path
if TYPE_CHECKING:
    from gpuckpt.cuda.node import NodeGpus

OWNED_VERBS = frozenset({"checkpoint", "restore", "pause", "resume", "delete"})


def _run_owned(args: RuntimeArgs, delegate: str, hook: str, gpus: NodeGpus | None) -> int:
    # pydantic runs the plugins any installed package declares inside every validation: none in a root
    # process, and their discovery (the entry points of every installed distribution) cost ~20 ms a verb
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    if args.command == "checkpoint":
        from gpuckpt.shim import checkpoint

        return checkpoint.run(args, delegate, gpus)
    if args.command == "restore":
        from gpuckpt.shim import restore
        from gpuckpt.shim.create import add_hook

        if hook:
            add_hook(args, hook, RESTORE_VALUE_FLAGS)
        return restore.run(args, delegate, gpus)
    if args.command == "delete":
        from gpuckpt.shim import delete

        return delete.run(args, delegate)
    from gpuckpt.shim import pause  # pause, resume: GPU suspension for containers that opted in

    return pause.run(args, delegate, gpus)


def _print_version(delegate: str) -> int:
    from gpuckpt.shim.delegate import delegate_version  # subprocess: not for pass-through

    sys.stdout.write(f"gpuckpt-runtime version {__version__}\ndelegate: {delegate}\n")
    sys.stdout.write(delegate_version(delegate))
    return 0


def main(argv: list[str] | None = None, gpus: NodeGpus | None = None) -> int:
    """`gpus`: the node's GPUs as the owned verbs reach them (the real ones unless a test's launcher
    gives its own, integration/fake_gpu_runtime.py)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_runtime_args(argv)
    try:
        resolved = resolve_runtime()
        delegate = resolved.delegate
        refused = hidden_checkpoint_or_restore(args)
        if refused:
            raise GpuckptError(refused)
        if args.wants_version and args.command is None and args.unknown_global is None:
            return _print_version(delegate)
        if args.command in OWNED_VERBS and args.unknown_global is None and not owned_verb_is_only_asked_about(args):
            return _run_owned(args, delegate, resolved.hook, gpus)
        if args.command == "create" and resolved.hook and args.unknown_global is None:
            from gpuckpt.shim.create import add_hook  # only with hook.add_to_spec on

            add_hook(args, resolved.hook)
        exec_delegate(delegate, argv)
        return 1  # not reached: exec replaced us
    except GpuckptError as error:
        from gpuckpt.shim.log import report_error

        report_error(args, str(error))
        return error.exit_status
    except Exception as error:  # a bug: still one line for the engine, the trace only on --debug
        if args.debug:
            import traceback

            traceback.print_exc()
        from gpuckpt.shim.log import report_error

        report_error(args, f"gpuckpt-runtime internal error: {type(error).__name__}: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
