"""`gpuckpt`: the command for people. One module per subcommand; this one dispatches.

Errors print as one line on stderr, with the exit status cli/exit_codes.py gives their kind; `--debug`
adds the trace. Every command but ROOT_FREE's needs root (the node's state, keys, store, engines and
service are root's): run by another user it says so once, before anything is tried.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from .. import __version__
from ..errors import GpuckptError, NotRootError
from ..store.repository import DEFAULT_STORE_DIR
from ..trust.keys import TRUST_DIR_ENV
from . import doctor, drain, group, inspect, install, pool, recover, restore, store, suspend, transfer, trust
from .exit_codes import FAILED, INTERRUPTED, exit_status
from .signals import UNWOUND_AT_TERM, Terminated, unwind_at_termination

# Commands another user may run: inspect reads a file the user names (a podman image in root's storage
# still needs root, and podman says so)
ROOT_FREE = frozenset({"inspect"})


# Store verbs that read or tidy a store without an engine: on a --store DIR of the user's own, no root
STORE_FILES_ONLY = frozenset({"list", "show", "verify", "remove", "prune"})


def needs_root(options: argparse.Namespace) -> bool:
    """Whether the command line needs root: every command on the node's own state does; one pointed at files
    of the user's own does not (`install --config FILE`, `store VERB --store DIR` for a verb that runs no
    engine, `trust` with GPUCKPT_TRUST_DIR set)."""
    if options.command == "install":
        return not options.config
    if options.command == "store":
        return options.store == DEFAULT_STORE_DIR or options.store_command not in STORE_FILES_ONLY
    if options.command == "trust":
        return not os.environ.get(TRUST_DIR_ENV)
    return options.command not in ROOT_FREE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuckpt", description="Transparent checkpoint/restore of GPU containers.")
    parser.add_argument("--version", action="version", version=f"gpuckpt {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (install, doctor, suspend, group, inspect, transfer, trust, drain, recover, store, restore, pool):
        module.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.command in UNWOUND_AT_TERM:
        unwind_at_termination()
    try:
        if os.geteuid() != 0 and needs_root(options):
            raise NotRootError("must be root (run it with sudo)")
        handler: Callable[[argparse.Namespace], int] = options.handler  # each command's add_parser sets it
        return handler(options)
    except GpuckptError as error:
        if options.debug:
            raise
        print(f"gpuckpt {options.command}: {error}", file=sys.stderr)
        return exit_status(error)
    except OSError as error:  # a full disk, a permission: still one line, not a traceback
        if options.debug:
            raise
        where = f"{error.filename}: " if error.filename else ""
        print(f"gpuckpt {options.command}: {where}{error.strerror or error}", file=sys.stderr)
        return FAILED
    except Terminated as terminated:
        return 128 + terminated.signum
    except KeyboardInterrupt:
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
