"""An argparse parser as a man(7) page, and the walk over its options and subcommands that the page and
the bash completion (cli/completion.py) share.

Phases of a page: NAME and SYNOPSIS from the parser's description and usage, DESCRIPTION, OPTIONS (each
positional and option as a .TP paragraph: its names bold, its value's name italic, its help), COMMANDS
(every subcommand depth first, with its usage, help and arguments), then the caller's closing sections.
argparse's own formatter names the values and expands the help (%(default)s), as --help shows them.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

Subcommands = argparse._SubParsersAction  # argparse's own type for a parser's subcommands


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if action.option_strings and action.help != argparse.SUPPRESS]


def positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if not action.option_strings and not isinstance(action, Subcommands)]


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order they were added."""
    found: list[tuple[str, str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, Subcommands):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen: set[int] = set()  # an alias names the same parser: it is listed once, by its first name
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    found.append((name, helps.get(name, ""), sub))
    return found


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """Every subcommand below `parser`, depth first: (its words after the program, help, parser)."""
    for name, text, sub in subcommands(parser):
        yield (*path, name), text, sub
        yield from walk(sub, (*path, name))



def roff_text(text: str) -> str:
    """Plain text as a roff text line: backslashes and hyphens escaped, no line read as a request."""
    escaped = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(f"\\&{line}" if line[:1] in (".", "'") else line for line in escaped.splitlines())


def bold(text: str) -> str:
    return f"\\fB{roff_text(text)}\\fR"


def _invocation(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    """-o OUTPUT, --output OUTPUT: option names bold, the value's name italic, as argparse names them."""
    if not action.option_strings:
        metavar = formatter._format_args(action, formatter._get_default_metavar_for_positional(action))
        return f"\\fI{roff_text(metavar)}\\fR"
    metavar = formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
    value = "" if action.nargs == 0 else f" \\fI{roff_text(metavar)}\\fR"
    return ", ".join(f"{bold(option)}{value}" for option in action.option_strings)


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


def man_page(name: str, parser: argparse.ArgumentParser, *, section: str, source: str, closing: list[str]) -> str:
    """`name`'s page: NAME (whatis's line: the description's first clause), SYNOPSIS, DESCRIPTION, OPTIONS,
    COMMANDS (every subcommand, nested ones included, with its usage, help and arguments), then `closing`
    (roff lines: FILES, SEE ALSO, ...)."""
    summary = re.split(r"\. |: | \(", parser.description or name)[0].rstrip(".")
    lines = [f'.TH {name.upper()} {section} "" "{source}" "{source.split()[0]}"',
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
    return "\n".join([*lines, *closing]) + "\n"
