"""`gpuckpt`: the command for people. One module per subcommand; this one dispatches.

Errors print as one line on stderr with exit status 1; `--debug` adds the trace.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .. import __version__
from ..errors import GpuckptError
from . import doctor, drain, inspect, install, pool, recover, restore, store, suspend, transfer, trust
from .signals import UNWOUND_AT_TERM, Terminated, unwind_at_termination


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuckpt", description="Transparent checkpoint/restore of GPU containers.")
    parser.add_argument("--version", action="version", version=f"gpuckpt {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (install, doctor, suspend, inspect, transfer, trust, drain, recover, store, restore, pool):
        module.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.command in UNWOUND_AT_TERM:
        unwind_at_termination()
    try:
        handler: Callable[[argparse.Namespace], int] = options.handler  # each command's add_parser sets it
        return handler(options)
    except GpuckptError as error:
        if options.debug:
            raise
        print(f"gpuckpt {options.command}: {error}", file=sys.stderr)
        return error.exit_status
    except OSError as error:  # a full disk, a permission: still one line, not a traceback
        if options.debug:
            raise
        where = f"{error.filename}: " if error.filename else ""
        print(f"gpuckpt {options.command}: {where}{error.strerror or error}", file=sys.stderr)
        return 1
    except Terminated as terminated:
        return 128 + terminated.signum
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
