"""runc command-line parsing: globals, the verb, and the verb's flags."""

import pytest

from gpuckpt.shim.argv import (
    CHECKPOINT_VALUE_FLAGS,
    RESTORE_VALUE_FLAGS,
    ambiguous_owned_call,
    for_delegate,
    hidden_checkpoint_or_restore,
    owned_verb_is_only_asked_about,
    parse_runtime_args,
    parse_verb_args,
)


def test_containerd_style_globals_then_verb() -> None:
    argv = ["--root", "/run/x", "--log", "/l.json", "--log-format", "json", "--systemd-cgroup",
            "checkpoint", "--image-path", "/img", "--work-path", "/w", "ctr1"]
    args = parse_runtime_args(argv)
    assert args.command == "checkpoint"
    assert args.log_path == "/l.json" and args.log_format == "json"
    assert args.global_argv == argv[:7]
    verb = parse_verb_args(args.command_args, CHECKPOINT_VALUE_FLAGS)
    assert verb.value("image-path") == "/img" and verb.container_id == "ctr1"


def test_equals_form_and_single_dash() -> None:
    args = parse_runtime_args(["-root=/r", "--debug", "state", "c"])
    assert args.globals_["root"] == "/r" and args.debug and args.command == "state"


def test_unknown_global_flag_stops_parsing_for_the_delegate() -> None:
    args = parse_runtime_args(["--no-such", "x", "state", "c"])
    assert args.unknown_global == "--no-such" and args.command is None


def test_restore_flags_with_values_are_not_taken_for_the_id() -> None:
    verb = parse_verb_args(["--bundle", "/b", "-d", "--pid-file", "/p", "--image-path", "/i", "ctr"],
                           RESTORE_VALUE_FLAGS)
    assert verb.container_id == "ctr" and verb.has("d") and verb.value("bundle", "b") == "/b"


def test_bool_flag_false_is_not_set() -> None:
    verb = parse_verb_args(["--leave-running=false", "c"], CHECKPOINT_VALUE_FLAGS)
    assert not verb.has("leave-running")


def test_bool_flags_read_as_go_reads_them() -> None:
    """runc reads `--help=F` as false and checkpoints: the shim must not take it for a help request."""
    assert not parse_verb_args(["--leave-running=F", "c"], CHECKPOINT_VALUE_FLAGS).has("leave-running")
    assert not owned_verb_is_only_asked_about(parse_runtime_args(["checkpoint", "--help=False", "c"]))
    assert not parse_runtime_args(["--debug=FALSE", "state", "c"]).debug


def test_a_global_help_or_version_is_the_delegates_answer() -> None:
    """runc answers `runc --help checkpoint ID` (or --version) and checkpoints nothing: nor must the shim."""
    assert owned_verb_is_only_asked_about(parse_runtime_args(["--help", "checkpoint", "c"]))
    assert owned_verb_is_only_asked_about(parse_runtime_args(["-v", "delete", "c"]))
    assert not owned_verb_is_only_asked_about(parse_runtime_args(["--debug", "checkpoint", "c"]))


def test_version_flag() -> None:
    assert parse_runtime_args(["--version"]).wants_version
    assert not parse_runtime_args(["state", "--version"]).wants_version


def test_crun_dialect_for_owned_verbs() -> None:
    argv = ["--root", "/r", "restore", "--image-path", "/i", "--detach", "-no-subreaper", "-d", "--bundle", "/b", "c1"]
    args = parse_runtime_args(argv)
    assert for_delegate("/usr/local/bin/crun", args, argv) == [
        "--root", "/r", "restore", "--image-path", "/i", "--detach", "-d", "--bundle", "/b", "c1"]
    assert for_delegate("/usr/sbin/runc", args, argv) == argv  # runc takes them as they are
    single = ["checkpoint", "-image-path", "/i", "c1"]
    assert for_delegate("crun", parse_runtime_args(single), single) == ["checkpoint", "--image-path", "/i", "c1"]


def test_crun_globals_are_known_and_an_unknown_one_hides_no_checkpoint() -> None:
    """crun takes --cgroup-manager and --log-level, and any abbreviation (--roo): the shim passed
    `--cgroup-manager=systemd checkpoint ID` to crun as it came, without its checks."""
    args = parse_runtime_args(["--cgroup-manager", "systemd", "--log-level=debug", "checkpoint", "c"])
    assert args.command == "checkpoint" and args.unknown_global is None
    refused = hidden_checkpoint_or_restore(parse_runtime_args(["--roo", "/run/x", "restore", "c"]))
    assert refused is not None and "'--roo'" in refused and "--cgroup-manager" in refused
    assert hidden_checkpoint_or_restore(parse_runtime_args(["--roo", "/run/x", "state", "c"])) is None


@pytest.mark.parametrize("argv", [
    ["checkpoint", "--image-path", "/i", "--work-path", "/w", "--leave-running", "c1"],  # podman
    ["restore", "--bundle", "/b", "--pid-file", "/p", "--detach", "--image-path", "/i", "--work-path", "/w", "c1"],
    ["restore", "--image-path", "/i", "--work-path", "/w", "-no-subreaper", "--detach", "-b", "/b", "c1"],  # containerd
    ["--root", "/r", "checkpoint", "--tcp-established", "--file-locks", "--manage-cgroups-mode", "soft", "--", "c1"],
    ["checkpoint", "--image-path", "s", "--work-path", "-", "c1"],  # values that look like prefixes or options
])
def test_what_engines_write_is_not_ambiguous(argv) -> None:
    args = parse_runtime_args(argv)
    assert ambiguous_owned_call(args) is None and not owned_verb_is_only_asked_about(args)


@pytest.mark.hostile("checkpoint/restore arguments crun reads otherwise than the shim (after the ID, prefixes, -b=)")
@pytest.mark.parametrize(("argv", "said"), [
    (["checkpoint", "c1", "--help"], "'--help' after the container"),
    (["restore", "--image-path", "/i", "c1", "--bundle=/elsewhere"], "'--bundle=/elsewhere' after the container"),
    (["restore", "--bund=/elsewhere", "c1"], "option '--bund=/elsewhere' is a prefix of another"),
    (["checkpoint", "--image=/elsewhere", "c1"], "option '--image=/elsewhere' is a prefix of another"),
    (["checkpoint", "--leave", "c1"], "option '--leave' is a prefix of another"),
    (["restore", "-b=/elsewhere", "c1"], "'-b=/elsewhere': give a one-letter option's value as its next argument"),
])
def test_ambiguous_checkpoint_and_restore_arguments_are_refused(argv, said) -> None:
    args = parse_runtime_args(argv)
    assert not owned_verb_is_only_asked_about(args)  # never passed through as a mere question
    refusal = ambiguous_owned_call(args)
    assert refusal is not None and said in refusal and "\n" not in refusal


def test_help_before_the_container_is_only_a_question() -> None:
    assert owned_verb_is_only_asked_about(parse_runtime_args(["checkpoint", "--help", "c1"]))
    assert owned_verb_is_only_asked_about(parse_runtime_args(["restore", "-h"]))
    assert not owned_verb_is_only_asked_about(parse_runtime_args(["checkpoint", "--help=false", "c1"]))
