"""An argparse parser as a bash completion function: subcommands, options and an option's choices.

The function walks the words typed so far down the subcommands (skipping each option's value), then offers
the options and subcommands of the parser it reached, or the choices of the option just typed. Where a
file name or a positional is due it offers nothing, and `complete -o default` lets readline complete file
names. It needs bash 4 and nothing of the bash-completion package.
"""

from __future__ import annotations

import argparse

from .roff import options, positionals, subcommands, walk


def _words(parser: argparse.ArgumentParser) -> list[str]:
    return [option for action in options(parser) for option in action.option_strings] + \
        [name for name, _, _ in subcommands(parser)]


def bash_completion(name: str, parser: argparse.ArgumentParser, *, source: str) -> str:
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
        f"# bash completion of {name}, generated from its parser ({source})",
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
