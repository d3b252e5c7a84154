"""The pages (README.md and docs/*.md) held to the code: what they name must exist.

How a page is read (the rules a writer follows; anything else on a page is prose, not checked):

- Code: the text of each inline code span (`...`, which may wrap a line) and each line of a fenced (```)
  or indented (4 spaces) code block. In a code block, `#` after a space starts a comment, and a line is
  cut into commands at `&&`, `;` and ` | `.
- Ours are three programs. A code span that starts with `gpuckpt ` and a code-block command that does,
  is a `gpuckpt` command line: its words are walked down the parser gpuckpt.cli.main.build_parser()
  builds, each word that is not an option choosing the next subcommand while the parser has
  subcommands (an unknown one fails; a group named alone, `gpuckpt trust`, is fine), and every
  option (`-x`, `--xyz`, `--xyz=V`) must be one of the parser it is given to; a value given to an
  option with choices (`--engine containerd`) must be a choice unless written in capitals (a
  placeholder). `[`, `]` around words are ignored (optional parts). One that starts with
  `gpuckpt-runtime ` is held to shim/argv.py's tables: options before
  the verb are runc's global options the shim knows, options after `checkpoint` or `restore` must
  be in that verb's tables, and options after any other verb are refused (the shim does not read
  them: they are the delegate's; write them as `runc VERB --option`). One that starts with
  `gpuckptd` is held to gpuckpt.service.main.build_parser()'s options.
- A code span that is an option alone (`--leave-running`, `-o`, `--work-path DIR`) must be ours:
  an option of some `gpuckpt` parser, one in shim/argv.py's tables, or gpuckptd's. Another program's option is
  written with its program in the span (`podman container restore --keep`): spans that start with
  any other word are not checked, and neither are other programs' command lines in code blocks.
- A code span `section.key` (lower case, digits and `_`, optionally followed by ` = value`) is a
  key of /etc/gpuckpt/config.toml: node/config.py's Config must have that section and the section
  that key. File names written so (`config.dump`, `trust.log`) are told apart by their suffix
  (FILE_SUFFIXES below). Another program's key is written with its file (`hooks_dir` in
  containers.conf's `[engine]`).
- A repository path: any word of a code span or code-block line, without spaces, whose first
  `/`-separated part names a top-level entry of this repository (`shim/`, `integration/`,
  `pyproject.toml`); it must exist (a trailing `/`: a folder). A pytest id's `::test` is cut off.
  Paths inside an archive, an image or on a node (`checkpoint/pages-N.img`, `/run/gpuckpt`) start
  otherwise and are not checked; so is a top-level folder this checkout does not have yet.
- A relative Markdown link `[text](target#anchor)` (its text may wrap a line) must name a file that
  exists (from the page's folder) and, with an anchor into a page, a heading of it (GitHub's slug).
  Links with a scheme (`https:`) are not checked.
- docs/configuration.md has a row for every key of node/config.py's model, and README.md links every
  page of docs/.
- README.md is at most 300 lines.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from gpuckpt.cli.main import build_parser
from gpuckpt.node.config import Config
from gpuckpt.service.main import build_parser as build_daemon_parser
from gpuckpt.shim import argv as runtime_argv

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300

# `a.b` spans that are file names, not config keys
FILE_SUFFIXES = frozenset({
    "json", "py", "toml", "dump", "img", "md", "sh", "c", "h", "log", "tar", "zst", "gz", "sig", "txt",
    "pub", "conf", "yaml", "service", "socket", "sock", "key", "lock", "holders", "partial", "so", "d", "proto",
    "files",
})

OPTION = re.compile(r"^--?[A-Za-z][\w-]*(=.*)?$")
CONFIG_KEY = re.compile(r"^([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)(\s*=.*)?$")
SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
TOP_LEVEL = frozenset(entry.name for entry in ROOT.iterdir() if not entry.name.startswith("."))


class Page:
    """A page's code spans and code-block lines, each with the line it starts on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path.relative_to(ROOT))
        self.spans: list[tuple[int, str]] = []
        self.block_lines: list[tuple[int, str]] = []
        self.prose: list[tuple[int, str]] = []
        self.headings: list[str] = []
        fenced = False
        previous = ""  # the line before, and whether it was in an indented block
        indented = False
        for number, line in enumerate(path.read_text().split("\n"), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                indented = False
            elif fenced:
                self.block_lines.append((number, line))
            elif line.startswith("    ") and (indented or not previous.strip()):
                self.block_lines.append((number, line))
                indented = True
            else:
                indented = False
                if line.startswith("#"):
                    self.headings.append(line.lstrip("#").strip())
                self.prose.append((number, line))
            previous = line
        text = "\n".join(line for _, line in self.prose)
        numbers = [number for number, _ in self.prose]
        for match in SPAN.finditer(text):
            first = numbers[text.count("\n", 0, match.start())]
            self.spans.append((first, " ".join(match.group(1).split())))

    def commands(self) -> list[tuple[int, str]]:
        """Spans, and code-block lines cut into commands (comments dropped)."""
        found = list(self.spans)
        for number, line in self.block_lines:
            line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
            for command in re.split(r"&&|;|\s\|\s|\|\|", line):
                if command.strip():
                    found.append((number, command.strip().removeprefix("$ ")))
        return found


def _pages() -> list[Page]:
    return [Page(path) for path in PAGES]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for child in _subparsers(parser).values():
        found.extend(_all_parsers(child))
    return found


ROOT_PARSER = build_parser()
GPUCKPT_OPTIONS = frozenset(option for parser in _all_parsers(ROOT_PARSER) for option in _options(parser))
RUNTIME_GLOBALS = runtime_argv.GLOBAL_VALUE_FLAGS | runtime_argv.GLOBAL_BOOL_FLAGS
RUNTIME_VERB_OPTIONS = {verb: runtime_argv.OWNED_VALUE_FLAGS[verb] | runtime_argv.OWNED_BOOL_FLAGS[verb]
                        for verb in runtime_argv.OWNED_VALUE_FLAGS}
RUNTIME_OPTIONS = RUNTIME_GLOBALS.union(*RUNTIME_VERB_OPTIONS.values())
DAEMON_OPTIONS = frozenset(_options(build_daemon_parser()))  # gpuckptd's


def _words(command: str) -> list[str]:
    return [word for word in command.replace("[", " ").replace("]", " ").split() if word]


def gpuckpt_problems(command: str) -> list[str]:
    """What in a `gpuckpt ...` command line the CLI's parsers do not have."""
    words = _words(command)[1:]
    parser, path, problems = ROOT_PARSER, ["gpuckpt"], []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if OPTION.match(word):
            name = word.split("=", 1)[0]
            action = _options(parser).get(name)
            if action is None:
                problems.append(f"`{' '.join(path)}` has no option {name}")
                continue
            takes_value = action.nargs != 0 and "=" not in word
            value = word.split("=", 1)[1] if "=" in word else (words[index] if takes_value and index < len(words)
                                                               else None)
            if takes_value:
                index += 1
            if action.choices and value is not None and not value.isupper() and value not in action.choices:
                problems.append(f"`{' '.join(path)} {name}` takes {sorted(action.choices)}, not {value!r}")
            continue
        children = _subparsers(parser)
        if children:
            if word not in children:
                problems.append(f"`{' '.join(path)}` has no subcommand {word!r} (it has {sorted(children)})")
                return problems
            parser, path = children[word], [*path, word]
    return problems


def runtime_problems(command: str) -> list[str]:
    """What in a `gpuckpt-runtime ...` command line shim/argv.py's tables do not have."""
    words = _words(command)[1:]
    verb: str | None = None
    problems = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not OPTION.match(word):
            verb = verb or word
            continue
        name = word.lstrip("-").split("=", 1)[0]
        if verb is None:
            if name not in RUNTIME_GLOBALS:
                problems.append(f"gpuckpt-runtime has no global option {word}")
            elif name in runtime_argv.GLOBAL_VALUE_FLAGS and "=" not in word:
                index += 1
        elif verb not in RUNTIME_VERB_OPTIONS:
            problems.append(f"gpuckpt-runtime reads no options of {verb!r} ({word}): write `runc {verb} {word}`")
        elif name not in RUNTIME_VERB_OPTIONS[verb]:
            problems.append(f"gpuckpt-runtime {verb} has no option {word}")
    return problems


def daemon_problems(command: str) -> list[str]:
    """What in a `gpuckptd ...` command line its parser does not have."""
    return [f"gpuckptd has no option {word}" for word in _words(command)[1:]
            if OPTION.match(word) and word.split("=", 1)[0] not in DAEMON_OPTIONS]


def option_problems(span: str) -> list[str]:
    """A span that is an option alone: it must be gpuckpt's, gpuckpt-runtime's or gpuckptd's."""
    word = span.split()[0]
    name = word.split("=", 1)[0]
    if name in GPUCKPT_OPTIONS or name.lstrip("-") in RUNTIME_OPTIONS or name in DAEMON_OPTIONS:
        return []
    return [f"{name} is no option of gpuckpt, gpuckpt-runtime or gpuckptd (another program's: name it in the span)"]


def config_problems(span: str) -> list[str]:
    match = CONFIG_KEY.match(span)
    if not match or match.group(2) in FILE_SUFFIXES:
        return []
    section_name, key = match.group(1), match.group(2)
    sections = {field.alias or name: field.annotation for name, field in Config.model_fields.items()}
    section = sections.get(section_name)
    if not (isinstance(section, type) and issubclass(section, BaseModel)):
        return [f"config has no section [{section_name}] (sections: {sorted(sections)})"]
    keys = {field.alias or name for name, field in section.model_fields.items()}
    if key not in keys:
        return [f"config section [{section_name}] has no key {key!r} (keys: {sorted(keys)})"]
    return []


def path_problems(text: str) -> list[str]:
    problems = []
    for word in text.split():
        word = word.split("::", 1)[0].rstrip(".,;:)")
        first = word.split("/", 1)[0]
        if "/" not in word or first not in TOP_LEVEL or any(mark in word for mark in "*{}<>…$"):
            continue
        target = ROOT / word
        if not target.exists() or (word.endswith("/") and not target.is_dir()):
            problems.append(f"no {word} in the repository")
    return problems


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower())
    return text.replace(" ", "-")


def link_problems(page: Page) -> list[tuple[int, str]]:
    problems = []
    text = "\n".join(line for _, line in page.prose)  # a link's text may wrap a line
    numbers = [number for number, _ in page.prose]
    for match in LINK.finditer(text):
        target, number = match.group(1), numbers[text.count("\n", 0, match.start())]
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not ours to hold
        file_part, _, anchor = target.partition("#")
        resolved = (page.path.parent / file_part).resolve() if file_part else page.path
        if not resolved.exists():
            problems.append((number, f"link {target}: no {resolved.relative_to(ROOT)}"))
        elif anchor and resolved.suffix == ".md":
            slugs = {_slug(heading) for heading in Page(resolved).headings}
            if anchor not in slugs:
                problems.append((number, f"link {target}: no heading #{anchor} in {resolved.name}"))
    return problems


def page_problems(page: Page) -> list[str]:
    found: list[tuple[int, str]] = []
    for number, text in page.spans:
        if OPTION.match(text.split()[0]) and not text.startswith(("gpuckpt", "-- ")):
            found += [(number, problem) for problem in option_problems(text)]
        found += [(number, problem) for problem in config_problems(text)]
    for number, command in page.commands():
        if command.startswith("gpuckpt "):
            found += [(number, problem) for problem in gpuckpt_problems(command)]
        elif command.startswith("gpuckpt-runtime "):
            found += [(number, problem) for problem in runtime_problems(command)]
        elif command.startswith("gpuckptd ") or command == "gpuckptd":
            found += [(number, problem) for problem in daemon_problems(command)]
        found += [(number, problem) for problem in path_problems(command)]
    found += link_problems(page)
    return [f"{page.name}:{number}: {problem}" for number, problem in sorted(set(found))]


@pytest.mark.parametrize("page", PAGES, ids=[str(path.relative_to(ROOT)) for path in PAGES])
def test_a_page_names_only_what_exists(page: Path) -> None:
    problems = page_problems(Page(page))
    assert not problems, "\n".join(problems)


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move text to docs/"


def test_every_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [path.name for path in PAGES[1:] if f"docs/{path.name}" not in readme]
    assert not missing, f"docs pages the README does not link: {missing}"


@pytest.mark.parametrize(("command", "wrong"), [
    ("gpuckpt export web --made-up-flag", "--made-up-flag"),
    ("gpuckpt trust frobnicate", "frobnicate"),
    ("gpuckpt install --engine lxc", "lxc"),
    ("gpuckpt store checkpoint web --keep 3", "--keep"),
])
def test_the_reader_catches_what_gpuckpt_lacks(command: str, wrong: str) -> None:
    assert any(wrong in problem for problem in gpuckpt_problems(command))


def test_the_reader_catches_what_the_runtime_lacks() -> None:
    assert runtime_problems("gpuckpt-runtime --root /r checkpoint --image-path D --leave-running ID") == []
    assert runtime_problems("gpuckpt-runtime checkpoint --made-up ID")
    assert runtime_problems("gpuckpt-runtime delete --force ID")
    assert runtime_problems("gpuckpt-runtime --made-up state ID")
    assert daemon_problems("gpuckptd --drain-on-stop") == []
    assert daemon_problems("gpuckptd --drain") == ["gpuckptd has no option --drain"]


def test_the_reader_tells_keys_from_files_and_others_options() -> None:
    assert config_problems("cuda.lock_timeout_ms") == []
    assert config_problems("import.max_entry_ratio = 4096") == []
    assert config_problems("cuda.made_up_key")
    assert config_problems("engine.hooks_dir")
    assert config_problems("config.dump") == []
    assert option_problems("--leave-running") == []
    assert option_problems("--trust-config") == []
    assert option_problems("--made-up-flag")
    assert path_problems("shim/checkpoint.py integration/gpu/ /run/gpuckpt checkpoint/pages-1.img") == []
    assert path_problems("shim/made_up.py")


def test_every_config_key_has_its_row() -> None:
    """docs/configuration.md names every key of node/config.py's model, as `section.key`."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    keys = ["delegate"] + [f"{section_field.alias or section}.{field.alias or name}"
                           for section, section_field in Config.model_fields.items()
                           if isinstance(section_field.annotation, type)
                           and issubclass(section_field.annotation, BaseModel)
                           for name, field in section_field.annotation.model_fields.items()]
    missing = [key for key in keys if f"| `{key}` |" not in page]
    assert not missing, f"keys of node/config.py without a row in docs/configuration.md: {missing}"
