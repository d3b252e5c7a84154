"""`gpuckpt-runtime`: runc's command line; owned verbs here, the rest exec'd unchanged.

This module is on the path of every container operation: it imports only the
argv parser and the pass-through (shim/resolve.py) until it knows the verb is one it
owns; the imports inside functions below are that dispatch, deferred on purpose.
"""

from __future__ import annotations

import os
import sys

from .. import __version__
from ..errors import GpuckptError, UsageError
from .argv import (
    OWNED_VERBS,
    RESTORE_VALUE_FLAGS,
    RuntimeArgs,
    ambiguous_owned_call,
    hidden_checkpoint_or_restore,
    owned_verb_is_only_asked_about,
    parse_runtime_args,
)
from .resolve import exec_delegate, resolve_runtime

TYPE_CHECKING = False  # typing's own flag costs an import on the pass-through path
if TYPE_CHECKING:
    from ..cuda.node import NodeGpus


def _run_owned(args: RuntimeArgs, delegate: str, hook: str, gpus: NodeGpus | None) -> int:
    if ambiguous := ambiguous_owned_call(args):
        raise UsageError(ambiguous)
    # pydantic runs the plugins any installed package declares inside every validation: none in a root
    # process, and their discovery (the entry points of every installed distribution) cost ~20 ms a verb
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    if args.command == "checkpoint":
        from . import checkpoint

        return checkpoint.run(args, delegate, gpus)
    if args.command == "restore":
        from . import restore
        from .create import add_hook

        if hook:
            add_hook(args, hook, RESTORE_VALUE_FLAGS)
        return restore.run(args, delegate, gpus)
    if args.command == "delete":
        from . import delete

        return delete.run(args, delegate)
    from . import pause  # pause, resume: GPU suspension for containers that opted in

    return pause.run(args, delegate, gpus)


def _print_version(delegate: str) -> int:
    from .delegate import delegate_version  # subprocess: not for pass-through

    sys.stdout.write(f"gpuckpt-runtime version {__version__}\ndelegate: {delegate}\n")
    sys.stdout.write(delegate_version(delegate))
    return 0


def main(argv: list[str] | None = None, gpus: NodeGpus | None = None, resident: bool = True,
         called_as: str | None = None) -> int:
    """`gpus`: the node's GPUs as the owned verbs reach them (the real ones unless a test's launcher
    gives its own, integration/fake_gpu_runtime.py); `resident`: whether an owned verb may go to the
    resident helper (the compiled launcher says False when the helper did not take it); `called_as`: the
    argv[0] the engine gave (the compiled launcher passes its own on; sys.argv[0] otherwise), whose name may
    choose the delegate (shim/resolve.py DELEGATE_NAMES)."""
    called_as = (sys.argv[0] if sys.argv else "") if called_as is None else called_as
    argv = sys.argv[1:] if argv is None else argv
    args = parse_runtime_args(argv)
    try:
        resolved = resolve_runtime(called_as)
        delegate = resolved.delegate
        refused = hidden_checkpoint_or_restore(args)
        if refused:
            raise GpuckptError(refused)
        if args.wants_version and args.command is None and args.unknown_global is None:
            return _print_version(delegate)
        if args.command in OWNED_VERBS and args.unknown_global is None and not owned_verb_is_only_asked_about(args):
            if gpus is None and resident:  # a test's launcher with GPUs of its own works its verbs itself
                from .resident.call import call_resident  # built-in modules only

                status = call_resident(argv, delegate, resolved.hook)
                if status is not None:
                    return status
            return _run_owned(args, delegate, resolved.hook, gpus)
        if args.command == "create" and resolved.hook and args.unknown_global is None:
            from .create import add_hook  # only with hook.add_to_spec on

            add_hook(args, resolved.hook)
        exec_delegate(delegate, argv)
        return 1  # not reached: exec replaced us
    except Exception as error:  # noqa: BLE001 -- the process edge: the engine gets one line and runc's status, never a trace
        return _report(args, error)


def _report(args: RuntimeArgs, error: Exception) -> int:
    """An error as the engine sees it: one line, and runc's exit status."""
    from .log import report_error

    if isinstance(error, GpuckptError):
        report_error(args, str(error))
        return error.exit_status
    if args.debug:  # a bug: still one line for the engine, the trace only on --debug
        import traceback

        traceback.print_exc()
    report_error(args, f"gpuckpt-runtime internal error: {type(error).__name__}: {error}")
    return 1


def work_owned(argv: list[str], delegate: str, hook: str) -> int:
    """An owned verb a caller handed to the resident helper (shim/resident/server.py), worked as main() would."""
    args = parse_runtime_args(argv)
    try:
        return _run_owned(args, delegate, hook, None)
    except Exception as error:  # noqa: BLE001 -- the process edge: the engine gets one line and runc's status, never a trace
        return _report(args, error)


if __name__ == "__main__":
    sys.exit(main())
