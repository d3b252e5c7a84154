"""The step checkpoint and restore share: which calls the shim acts on, and the delegate's argv."""

import os

from gpuckpt.shim.argv import CHECKPOINT_VALUE_FLAGS, RESTORE_VALUE_FLAGS, delegate_argv, parse_runtime_args
from gpuckpt.shim.delegate import owned_call


def test_help_or_no_container_is_the_delegate_s_to_answer(tmp_path) -> None:
    work = tmp_path / "work"
    for argv in (["checkpoint", "--help", "c1"], ["checkpoint", "-h"], ["--root", "/r", "checkpoint"],
                 ["checkpoint", "--work-path", str(work)]):
        assert owned_call(parse_runtime_args(argv), CHECKPOINT_VALUE_FLAGS) is None
    assert not work.exists()  # nothing made for a call the shim does not act on


def test_an_owned_call_gets_its_verb_container_and_work_path(tmp_path) -> None:
    work = tmp_path / "work"
    args = parse_runtime_args(["restore", "--work-path", str(work), "--bundle", "/b", "c1"])
    owned = owned_call(args, RESTORE_VALUE_FLAGS)
    assert owned is not None
    verb, container_id = owned
    assert container_id == "c1" and verb.value("bundle") == "/b"
    assert work.is_dir() and os.stat(work).st_mode & 0o777 == 0o700  # made as runc makes it


def test_delegate_argv_adds_options_after_the_verb_in_the_delegate_s_dialect() -> None:
    args = parse_runtime_args(["--root", "/r", "restore", "-no-subreaper", "c1"])
    assert delegate_argv("runc", args) == args.argv
    assert delegate_argv("/usr/sbin/runc", args, ["--tcp-established"]) == [
        "--root", "/r", "restore", "--tcp-established", "-no-subreaper", "c1"]
    assert delegate_argv("crun", args, ["--tcp-established"]) == [
        "--root", "/r", "restore", "--tcp-established", "c1"]  # crun has no -no-subreaper
