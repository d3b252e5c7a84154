"""Manual pages and bash completion of the installed commands, generated from their parsers.

Phases: each command's parser (gpuckpt's and gpuckptd's own; for gpuckpt-runtime, gpuckpt-runtimed
and gpuckpt-hook, parsers built here from the tables their code reads: shim/argv.py, the hook's
stages); walked in order (options, positionals, subcommands, nested); written as man(7) roff and
as a bash completion function. Nothing here names a flag: one added to a parser is in the next
package's page and completion. Run at package build time (packaging/stage.sh):
`python3 -m gpuckpt.cli.manual DESTDIR` writes DESTDIR/usr/share/man/man8/NAME.8 and
DESTDIR/usr/share/bash-completion/completions/NAME.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from .. import __version__
from ..hooks.main import build_parser as hook_parser
from ..node.inventory import INVENTORY_DIR_ENV
from ..node.paths import CONFIG_PATH_ENV
from ..service.main import build_parser as service_parser
from ..shim import argv
from ..shim.resident.server import build_parser as runtimed_parser
from . import completion, roff
from .exit_codes import EXIT_CODES, FAILED, INTERRUPTED, OK
from .main import build_parser as cli_parser

SECTION = "8"  # every command is the administrator's: they need root
MAN_DIR = f"/usr/share/man/man{SECTION}"
COMPLETION_DIR = "/usr/share/bash-completion/completions"  # bash-completion loads NAME's file on first use
CONFIG = "/etc/gpuckpt/config.toml"
DOCS = "/usr/share/doc/gpuckpt/docs"  # the packages install docs/*.md there (packaging/stage.sh)
DEFAULT_INVENTORY = "/run/gpuckpt/containers"  # node/inventory.py inventory_dir() with no variable set


def runtime_parser() -> argparse.ArgumentParser:
    """runc's command line as gpuckpt-runtime reads it (shim/argv.py's tables), for its page."""
    parser = argparse.ArgumentParser(
        prog="gpuckpt-runtime", add_help=False,
        description="An OCI runtime with runc's command line, in front of runc or crun (the delegate). "
                    "checkpoint and restore also move the CUDA state of the container's processes (the NVIDIA "
                    "driver's checkpoint API) and are checked against the node's policy; pause and resume "
                    "suspend CUDA processes of containers that opted in; every other verb (create, start, run, "
                    "exec, kill, state, list, ...) is executed by the delegate unchanged. Engines run it: "
                    "register it with `gpuckpt install`. The options below are runc's (see runc(8)), given to the "
                    "delegate as they are; these are the ones gpuckpt-runtime reads.")
    _add_runc_flags(parser, argv.GLOBAL_VALUE_FLAGS, argv.GLOBAL_BOOL_FLAGS)
    verbs = parser.add_subparsers(metavar="COMMAND", title="commands")
    for verb in sorted(argv.OWNED_VERBS):
        sub = verbs.add_parser(verb, add_help=False, help=OWNED_VERB_HELP.get(verb, f"the delegate's {verb}"))
        _add_runc_flags(sub, argv.OWNED_VALUE_FLAGS.get(verb, frozenset()),
                        argv.OWNED_BOOL_FLAGS.get(verb, frozenset()))
        sub.add_argument("container_id", metavar="ID")
    return parser


# What the runtime adds to the verbs it works itself (shim/main.py); their flags are runc's, passed on.
OWNED_VERB_HELP = {
    "checkpoint": "the delegate's checkpoint, refused where the node's policy does not allow it, with the CUDA "
                  "processes locked and their GPU state in host memory for CRIU's dump; a GPU manifest beside the "
                  "images",
    "restore": "the delegate's restore of images checked first (signature, manifest, this node's GPUs), then the "
               "CUDA state restored, remapped where the GPUs changed",
    "pause": "for a container that opted in (io.gpuckpt.suspend-on-pause=true): its CUDA processes suspended "
             "before the freeze",
    "resume": "for a container that opted in: its CUDA processes resumed after the thaw",
    "delete": "the delegate's delete, saying 'does not exist' as runc does for a container a checkpoint removed",
}


def _add_runc_flags(parser: argparse.ArgumentParser, value_flags: frozenset[str], bool_flags: frozenset[str]) -> None:
    """Each flag once, its one-letter alias beside it (-b, --bundle); runc's meaning, given to the delegate as is."""
    flags = value_flags | bool_flags
    long_names = sorted(name for name in flags if len(name) > 1)
    for name in long_names:
        aliases = [f"-{short}" for short in flags  # -b is --bundle's: the one long name it starts
                   if len(short) == 1 and [other for other in long_names if other[0] == short] == [name]]
        if name in value_flags:
            parser.add_argument(*aliases, f"--{name}", metavar=name.upper().replace("-", "_"))
        else:
            parser.add_argument(*aliases, f"--{name}", action="store_true")


# name -> its parser, whether bash completes it (engines and systemd run the other three)
COMMANDS: dict[str, tuple[Callable[[], argparse.ArgumentParser], bool]] = {
    "gpuckpt": (cli_parser, True),
    "gpuckptd": (service_parser, True),
    "gpuckpt-runtime": (runtime_parser, False),
    "gpuckpt-runtimed": (runtimed_parser, False),
    "gpuckpt-hook": (hook_parser, False),
}


def exit_status_section() -> list[str]:
    """gpuckpt's EXIT STATUS, from cli/exit_codes.py's one table (docs/cli-output.md is held to it too)."""
    rows = [(OK, "done"), (FAILED, "failed otherwise: an I/O error, a busy lock, a container that failed in a drain"),
            *sorted((row.status, row.meaning) for row in EXIT_CODES),
            (INTERRUPTED, "interrupted: Ctrl-C (SIGINT); SIGTERM and SIGHUP give 128 + the signal")]
    lines = [".SH EXIT STATUS"]
    for status, meaning in rows:
        lines += [".TP", roff.bold(str(status)), roff.roff_text(meaning)]
    return lines


def man_page(name: str, parser: argparse.ArgumentParser) -> str:
    """`name`'s page (cli/roff.py) with the closing sections every gpuckpt page has: (gpuckpt's EXIT STATUS),
    ENVIRONMENT, FILES, SEE ALSO."""
    closing = exit_status_section() if name == "gpuckpt" else []
    closing += [".SH ENVIRONMENT", ".TP", roff.bold(CONFIG_PATH_ENV),
                f"the configuration file to read instead of {roff.roff_text(CONFIG)}",
                ".TP", roff.bold(INVENTORY_DIR_ENV),
                roff.roff_text(f"the container inventory's directory instead of {DEFAULT_INVENTORY}: gpuckptd drains "
                               "and checkpoints the records there (a gpuckptd of its own, with its own "
                               "service.socket, for some containers only)")]
    closing += [".SH FILES", ".TP", roff.bold(CONFIG),
                "the node's configuration (every key, commented, at its default)", ".SH SEE ALSO"]
    closing += [f".BR {other} ({SECTION})," for other in sorted(COMMANDS) if other != name]
    closing += [".BR runc (8);", f"the manual in {roff.roff_text(DOCS)}."]
    return roff.man_page(name, parser, section=SECTION, source=f"gpuckpt {__version__}", closing=closing)


def bash_completion(name: str, parser: argparse.ArgumentParser) -> str:
    return completion.bash_completion(name, parser, source=f"gpuckpt {__version__}: gpuckpt.cli.manual")


def write_all(destdir: str) -> list[str]:
    """Every command's page and completion under `destdir`; the paths written."""
    written = []
    for name, (make_parser, completes) in COMMANDS.items():
        parser = make_parser()
        outputs = [(f"{MAN_DIR}/{name}.{SECTION}", man_page(name, parser))]
        if completes:
            outputs.append((f"{COMPLETION_DIR}/{name}", bash_completion(name, parser)))
        for path, text in outputs:
            target = destdir + path
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as output:
                output.write(text)
            os.chmod(target, 0o644)
            written.append(target)
    return written


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    if len(args) != 1:
        sys.stderr.write("usage: python3 -m gpuckpt.cli.manual DESTDIR (writes usr/share/man and "
                         "usr/share/bash-completion below it)\n")
        return 2
    for path in write_all(args[0]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
