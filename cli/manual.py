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
import re
import sys
from collections.abc import Callable, Iterator

from .. import __version__
from ..node.hook_entry import STAGES
from ..service.main import build_parser as service_parser
from ..shim import argv
from .main import build_parser as cli_parser

SECTION = "8"  # every command is the administrator's: they need root
MAN_DIR = f"/usr/share/man/man{SECTION}"
COMPLETION_DIR = "/usr/share/bash-completion/completions"  # bash-completion loads NAME's file on first use
CONFIG = "/etc/gpuckpt/config.toml"
DOCS = "/usr/share/doc/gpuckpt"
Subcommands = argparse._SubParsersAction  # argparse's own type for a parser's subcommands


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


def runtimed_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="gpuckpt-runtimed",
        description="gpuckpt-runtime's resident helper: it keeps the checkpoint and restore code loaded and a worker "
                    "warmed, so an owned verb does not pay the interpreter's imports each call. Started by systemd "
                    "(gpuckpt-runtimed.socket); it takes no arguments. Without it, gpuckpt-runtime works the verb "
                    "itself.")


def hook_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuckpt-hook",
        description="The OCI hook that keeps the node's inventory of GPU containers (the containers gpuckptd drains "
                    "and checkpoints). Engines run it from its hooks.d file with the container's state on stdin: at "
                    "createRuntime a container given NVIDIA GPUs (or annotated io.gpuckpt.inventory=true) is "
                    "recorded, and one asking for a GPU this node does not have is refused before its process "
                    "runs; at poststop its record goes.")
    parser.add_argument("stage", choices=STAGES, help="the OCI hook stage it runs at")
    return parser


# name -> its parser, whether bash completes it (engines and systemd run the other three)
COMMANDS: dict[str, tuple[Callable[[], argparse.ArgumentParser], bool]] = {
    "gpuckpt": (cli_parser, True),
    "gpuckptd": (service_parser, True),
    "gpuckpt-runtime": (runtime_parser, False),
    "gpuckpt-runtimed": (runtimed_parser, False),
    "gpuckpt-hook": (hook_parser, False),
}


# --- walking a parser ---------------------------------------------------------------------------------------------

def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if action.option_strings and action.help != argparse.SUPPRESS]


def positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if not action.option_strings and not isinstance(action, Subcommands)]


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order they were added."""
    found = []
    for action in parser._actions:
        if isinstance(action, Subcommands):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """Every subcommand below `parser`, depth first: (its words after the program, help, parser)."""
    for name, text, sub in subcommands(parser):
        yield (*path, name), text, sub
        yield from walk(sub, (*path, name))


# --- roff ---------------------------------------------------------------------------------------------------------

def roff_text(text: str) -> str:
    """Plain text as a roff text line: backslashes and hyphens escaped, no line read as a request."""
    escaped = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(f"\\&{line}" if line[:1] in (".", "'") else line for line in escaped.splitlines())


def _bold(text: str) -> str:
    return f"\\fB{roff_text(text)}\\fR"


def _invocation(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    """-o OUTPUT, --output OUTPUT: option names bold, the value's name italic, as argparse names them."""
    if not action.option_strings:
        metavar = formatter._format_args(action, formatter._get_default_metavar_for_positional(action))
        return f"\\fI{roff_text(metavar)}\\fR"
    metavar = formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
    value = "" if action.nargs == 0 else f" \\fI{roff_text(metavar)}\\fR"
    return ", ".join(f"{_bold(option)}{value}" for option in action.option_strings)


def _usage(parser: argparse.ArgumentParser) -> str:
    usage = parser.format_usage().removeprefix("usage: ").strip()
    return roff_text(" ".join(usage.split()))


def _help(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    text = formatter._expand_help(action) if action.help else ""
    if action.required and action.option_strings:
        text = f"{text} (required)" if text else "required"
    return text


def _arguments(parser: argparse.ArgumentParser, *, with_help: bool = True) -> list[str]:
    """.TP paragraphs of each positional, then each option (-h/--help only where `with_help`)."""
    formatter = parser._get_formatter()
    lines = []
    for action in positionals(parser) + options(parser):
        if isinstance(action, argparse._HelpAction) and not with_help:
            continue
        lines += [".TP", _invocation(formatter, action)]
        if text := _help(formatter, action):
            lines.append(roff_text(text))
    return lines


def man_page(name: str, parser: argparse.ArgumentParser) -> str:
    """`name`'s page: NAME, SYNOPSIS, DESCRIPTION, OPTIONS, a COMMANDS section with every subcommand's
    usage, help and arguments, FILES, SEE ALSO."""
    # the first sentence to its first colon or parenthesis: whatis's one line
    summary = re.split(r"\. |: | \(", parser.description or name)[0].rstrip(".")
    lines = [f'.TH {name.upper()} {SECTION} "" "gpuckpt {__version__}" "gpuckpt"',
             ".nh",  # no word of a command line broken across lines
             ".SH NAME", f"{roff_text(name)} \\- {roff_text(summary[:1].lower() + summary[1:])}",
             ".SH SYNOPSIS", _usage(parser)]
    if parser.description:
        lines += [".SH DESCRIPTION", roff_text(parser.description)]
    if arguments := _arguments(parser):
        lines += [".SH OPTIONS", *arguments]
    if commands := list(walk(parser)):
        lines.append(".SH COMMANDS")
        for words, text, sub in commands:
            lines += [f'.SS "{roff_text(" ".join((name, *words)))}"', _usage(sub), ".PP"]
            if text or sub.description:
                lines += [roff_text(sub.description or text), ".PP"]
            lines += _arguments(sub, with_help=False)  # the top's OPTIONS say -h once
    lines += [".SH FILES", ".TP", _bold(CONFIG), "the node's configuration (every key, commented, at its default)",
              ".SH SEE ALSO"]
    others = sorted(other for other in COMMANDS if other != name)
    lines += [f".BR {other} ({SECTION})," for other in others]
    lines += [".BR runc (8);", f"the manual in {roff_text(DOCS)}."]
    return "\n".join(lines) + "\n"


# --- bash completion ----------------------------------------------------------------------------------------------

def _words(parser: argparse.ArgumentParser) -> list[str]:
    return [option for action in options(parser) for option in action.option_strings] + \
        [name for name, _, _ in subcommands(parser)]


def bash_completion(name: str, parser: argparse.ArgumentParser) -> str:
    """A completion function for `name`: it follows the subcommands typed so far, offers the next
    subcommands and options, an option's choices after it, and file names elsewhere (-o default)."""
    function = "_" + name.replace("-", "_")
    places = [((), parser)] + [(words, sub) for words, _, sub in walk(parser)]
    steps, takes_value, choices, offered = [], [], [], []
    for words, sub in places:
        key = " ".join((name, *words))
        steps += [f'"{key}:{child}"' for child, _, _ in subcommands(sub)]
        for action in options(sub):
            if action.nargs == 0:
                continue
            takes_value += [f'"{key}:{option}"' for option in action.option_strings]
            if action.choices is not None:
                values = " ".join(map(str, action.choices))
                choices.append(f'        {"|".join(f"{key}:{option}" for option in action.option_strings)!r}) '
                               f'words="{values}";;')
        # where a positional is due, a word not starting with - completes as a file name (-o default)
        due = '[[ $cur == -* ]] || return; ' if positionals(sub) and not subcommands(sub) else ""
        offered.append(f'        {key!r}) {due}words="{" ".join(_words(sub))}";;')
    return "\n".join([
        f"# bash completion of {name}, generated from its parser (gpuckpt {__version__}: gpuckpt.cli.manual)",
        f"{function}() {{",
        f"    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} path={name} words= i skip=0",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        "        if ((skip)); then skip=0; continue; fi",
        '        case "$path:${COMP_WORDS[i]}" in',
        f"            {'|'.join(steps) or '__none__'}) path+=\" ${{COMP_WORDS[i]}}\";;",
        f"            {'|'.join(takes_value) or '__none__'}) skip=1;;",
        "        esac",
        "    done",
        '    case "$path:$prev" in',
        *choices,
        f"        {'|'.join(takes_value) or '__none__'}) return;;  # a value: file names (-o default)",
        "    esac",
        '    if [[ -z $words ]]; then',
        '        case "$path" in',
        *offered,
        "        esac",
        "    fi",
        '    mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")',
        "}",
        f"complete -o default -F {function} {name}",
        ""])


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
