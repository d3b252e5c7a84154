"""Manual pages and bash completion generated from the commands' parsers (cli/manual.py, roff.py,
completion.py).

Phases: every installed command has a page; each page, rendered by groff as man(1) would, names
every subcommand and option its parser has (a flag added to a parser is on the page with no other
edit) and renders without a warning; the bash completion, loaded into a real bash and called as
readline calls it (COMP_WORDS, COMP_CWORD), completes subcommands, options and choices.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpuckpt.cli import manual, roff
from gpuckpt.cli.main import build_parser
from gpuckpt.service import main as service_main

ROOT = Path(__file__).resolve().parents[1]
needs_groff = pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed (apt-get install "
                                                                       "groff-base)")


def render(page: str) -> tuple[str, str]:
    """The page as man(1) shows it, in plain ASCII, and groff's warnings (-ww: all of them)."""
    done = subprocess.run(["groff", "-ww", "-man", "-Tascii", "-P-cbou", "-rLL=200n"], input=page,
                          capture_output=True, text=True, check=True)
    return done.stdout, done.stderr


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return next(sub for sub_name, _, sub in roff.subcommands(parser) if sub_name == name)


def every_option_and_command(name: str, parser: argparse.ArgumentParser) -> list[str]:
    words = [option for action in roff.options(parser) for option in action.option_strings]
    for path, _, sub in roff.walk(parser):
        words.append(" ".join((name, *path)))
        words += [option for action in roff.options(sub) for option in action.option_strings]
    return words


def test_every_installed_command_has_a_page() -> None:
    with open(ROOT / "pyproject.toml", "rb") as pyproject:
        scripts = tomllib.load(pyproject)["project"]["scripts"]
    assert sorted(manual.COMMANDS) == sorted(scripts)


@needs_groff
@pytest.mark.parametrize("name", sorted(manual.COMMANDS))
def test_the_page_names_every_subcommand_and_option_and_renders_cleanly(name: str) -> None:
    parser = manual.COMMANDS[name][0]()
    text, warnings = render(manual.man_page(name, parser))
    assert warnings == ""
    assert text.split("\n", 1)[0].split()[0] == f"{name.upper()}({manual.SECTION})"
    shown = " ".join(text.split())
    assert f"NAME {name} - " in shown  # the NAME line whatis and lintian read
    missing = [word for word in every_option_and_command(name, parser) if word not in shown]
    assert missing == []


def test_the_gpuckpt_page_has_the_nested_subcommands() -> None:
    page = manual.man_page("gpuckpt", build_parser())
    for heading in ('.SS "gpuckpt store prune"', '.SS "gpuckpt trust verify"', '.SS "gpuckpt service status"'):
        assert heading in page
    assert "\\fB\\-\\-keep\\fR \\fIN\\fR" in page  # an option's value named by its metavar


@needs_groff
def test_a_flag_added_to_a_parser_is_on_the_page() -> None:
    parser = build_parser()
    prune = subcommand(subcommand(parser, "store"), "prune")
    prune.add_argument("--older-than-test", metavar="DAYS", help="a flag no page was written for")
    text, _ = render(manual.man_page("gpuckpt", parser))
    assert "--older-than-test DAYS" in text and "a flag no page was written for" in text


def test_roff_text_keeps_lines_from_being_requests() -> None:
    assert roff.roff_text(".SH not a heading\n'quote\nC:\\path -x") == \
        "\\&.SH not a heading\n\\&'quote\nC:\\epath \\-x"


def test_gpuckptd_takes_help_and_refuses_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as asked:
        service_main.main(["--help"])
    assert asked.value.code == 0 and "/etc/gpuckpt/config.toml" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        service_main.main(["--bogus"])
    assert refused.value.code == 2 and "--bogus" in capsys.readouterr().err


# --- bash completion ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def completion(tmp_path_factory) -> Path:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    path = tmp_path_factory.mktemp("completion") / "gpuckpt"
    path.write_text(manual.bash_completion("gpuckpt", build_parser()))
    return path


def complete(script: Path, *words: str) -> list[str]:
    """What the completion offers for the command line `words` (the last one being typed), as readline
    asks for it: COMP_WORDS/COMP_CWORD set, the function `complete -p` names called."""
    quoted = " ".join(f"'{word}'" for word in words)
    program = (f"source '{script}'; spec=$(complete -p {words[0]}); function=${{spec##*-F }}; "
               f"function=${{function%% *}}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
               "COMP_LINE=\"${COMP_WORDS[*]}\"; COMP_POINT=${#COMP_LINE}; "
               "$function; printf '%s\\n' \"${COMPREPLY[@]}\"")
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          check=True)
    assert done.stderr == ""
    return [line for line in done.stdout.splitlines() if line]


def test_completion_is_registered_for_the_command(completion: Path) -> None:
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", f"source '{completion}'; complete -p gpuckpt"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "complete -o default -F _gpuckpt gpuckpt"


def test_completion_offers_every_subcommand(completion: Path) -> None:
    offered = complete(completion, "gpuckpt", "")
    assert [name for name, _, _ in roff.subcommands(build_parser())] == [word for word in offered
                                                                           if not word.startswith("-")]
    assert complete(completion, "gpuckpt", "st") == ["status", "store"]
    assert complete(completion, "gpuckpt", "--debug", "store", "pr") == ["prune"]
    trust = subcommand(build_parser(), "trust")
    assert complete(completion, "gpuckpt", "trust", "") == ["-h", "--help", *(name for name, _, _ in
                                                                              roff.subcommands(trust))]


def test_completion_offers_options_and_choices(completion: Path) -> None:
    assert "--keep" in complete(completion, "gpuckpt", "store", "prune", "--")
    assert complete(completion, "gpuckpt", "install", "--engine", "") == ["podman", "docker", "containerd"]
    assert complete(completion, "gpuckpt", "install", "--engine", "d") == ["docker"]
    # after an option's value, options again; the value was not taken for a subcommand
    assert "--default" in complete(completion, "gpuckpt", "install", "--engine", "docker", "--")


def test_completion_leaves_file_names_to_readline_where_a_path_is_due(completion: Path) -> None:
    # -o default: an empty reply makes readline complete file names
    assert complete(completion, "gpuckpt", "export", "web", "-o", "") == []
    assert complete(completion, "gpuckpt", "import", "") == []
    assert "--signature" in complete(completion, "gpuckpt", "import", "--s")


def test_every_command_answers_help_as_its_page_says() -> None:
    """Each page lists -h, --help: the installed command must answer it (gpuckpt-runtimed said "takes no
    arguments", exit 2, under a page listing --help), and refuse another word with its usage."""
    for name in ("gpuckpt", "gpuckptd", "gpuckpt-runtimed", "gpuckpt-hook"):
        program = shutil.which(name, path=str(Path(sys.executable).parent))
        assert program, f"{name} is not installed beside {sys.executable}"
        assert "--help" in manual.COMMANDS[name][0]()._option_string_actions, name  # what its page lists
        answered = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=60)
        assert answered.returncode == 0 and answered.stdout.startswith(f"usage: {name}"), (name, answered)
        if name == "gpuckpt-runtimed":
            refused = subprocess.run([program, "--listen-here"], capture_output=True, text=True, timeout=60)
            assert refused.returncode == 2 and "usage: gpuckpt-runtimed" in refused.stderr, refused



@needs_groff
def test_the_gpuckpt_page_has_its_exit_statuses_and_environment() -> None:
    """A script's author reading `man gpuckpt` found no exit status (the operator trial of issue 33): the page
    lists cli/exit_codes.py's table, every status with its meaning, and GPUCKPT_CONFIG."""
    from gpuckpt.cli.exit_codes import EXIT_CODES

    page, warnings = render(manual.man_page("gpuckpt", build_parser()))
    assert warnings == ""
    section = page.split("EXIT STATUS", 1)[1].split("ENVIRONMENT", 1)[0]
    statuses = [int(line.split()[0]) for line in section.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert statuses == [0, 1, *sorted(row.status for row in EXIT_CODES), 130], section
    assert "must be root" in section and "interrupted" in section
    assert "GPUCKPT_CONFIG" in page.split("ENVIRONMENT", 1)[1].split("FILES", 1)[0]
    daemon, _ = render(manual.man_page("gpuckptd", service_main.build_parser()))
    assert "EXIT STATUS" not in daemon and "GPUCKPT_CONFIG" in daemon  # gpuckpt's table is gpuckpt's


@needs_groff
def test_every_page_names_the_inventory_variable_a_scoped_gpuckptd_needs() -> None:
    """The trial of 2026-11-28b scoped a gpuckptd of its own to one container with GPUCKPT_INVENTORY_DIR, found
    only in docs/configuration.md (not on the node): the pages' ENVIRONMENT names it beside GPUCKPT_CONFIG."""
    for name, parser in (("gpuckpt", build_parser()), ("gpuckptd", service_main.build_parser())):
        page, warnings = render(manual.man_page(name, parser))
        environment = page.split("ENVIRONMENT", 1)[1].split("FILES", 1)[0]
        assert warnings == "" and "GPUCKPT_INVENTORY_DIR" in environment and "/run/gpuckpt/containers" in environment
