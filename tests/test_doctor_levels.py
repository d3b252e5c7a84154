"""`gpuckpt doctor`'s levels (ok, warn, FAIL, skip), its --json, fixes an operator with only the package can
follow, and a preemption gpuckptd holds pending shown as a warning (issue 33)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuckpt.cli import doctor
from gpuckpt.cli.main import main
from gpuckpt.trust.keys import TrustPolicy, UnsignedSource, ensure_node_key, save_policy


@pytest.fixture
def trust_dir(node: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This node's own key, in a trust directory of the test's."""
    monkeypatch.setenv("GPUCKPT_TRUST_DIR", str(node / "trust"))
    ensure_node_key()
    return node / "trust"


@pytest.fixture
def no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The NVIDIA control device this node would have, absent (the test bed's machine has none either)."""
    monkeypatch.setattr(doctor, "NVIDIA_CONTROL_DEVICE", str(tmp_path / "nvidiactl"))


def test_an_unsigned_exception_is_a_warning_not_ok(trust_dir: Path, monkeypatch, capsys) -> None:
    save_policy(TrustPolicy(allow_unsigned=[UnsignedSource(source="restore:any")]))
    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_trust])
    assert main(["doctor"]) == 0  # a warning fails nothing
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("warn   trust: node key ") and "UNSIGNED accepted (logged) from: restore:any" in lines[0]
    assert lines[1] == "       fix: once they are no longer needed: gpuckpt trust disallow-unsigned restore:any"


def test_no_unsigned_exception_is_ok(trust_dir: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_trust])
    assert main(["doctor"]) == 0
    assert capsys.readouterr().out.startswith("ok     trust: node key ")


def test_a_node_without_a_gpu_says_the_gpu_checks_are_skipped(node, no_gpu, monkeypatch, capsys) -> None:
    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_driver])
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("skip   GPU checks skipped: no NVIDIA GPU driver on this node (") and out.count("\n") == 1


def test_json_holds_each_check_with_its_level_and_fix(trust_dir: Path, no_gpu, monkeypatch, capsys) -> None:
    save_policy(TrustPolicy(allow_unsigned=[UnsignedSource(source="restore:any")]))
    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_kernel, doctor.check_trust, doctor.check_driver])
    assert main(["doctor", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["schema_version"], shown["kind"], shown["failed"], shown["warned"]) == (1, "doctor", 0, 1)
    assert [(check["check"], check["level"]) for check in shown["checks"]] == [
        ("kernel", "ok" if os.path.exists("/proc/sys/kernel/ns_last_pid") else "fail"), ("trust", "warn"),
        ("driver", "skip")]
    assert shown["checks"][1]["fix"].endswith("gpuckpt trust disallow-unsigned restore:any")


def test_an_old_criu_first_on_path_gets_a_fix_the_package_alone_can_follow(node, tmp_path, monkeypatch, capsys) -> None:
    """Debian 12's CRIU 3.17: the fix named a test-bed script the package does not ship."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    criu = bin_dir / "criu"
    criu.write_text("#!/bin/sh\necho 'Version: 3.17.1'\n")
    criu.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_criu])
    assert main(["doctor"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "FAIL   criu 'Version: 3.17.1' is older than 4"
    assert lines[1] == f"       fix: {doctor.CRIU_FIX}"
    assert "integration/" not in lines[1] and "CRIU >= 4.2" in lines[1] and "docs/node.md" in lines[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="gpuckptd's socket answers only root (SO_PEERCRED): CI runs as root")
def test_a_pending_preemption_is_a_warning_naming_when_its_deadline_and_the_reset(node: Path, monkeypatch,
                                                                                  capsys, served_watch) -> None:
    """gpuckptd's own server and preemption watch on a socket of the test's: the status doctor reads is the one
    the service sends (service/api.py's Status), not a copy of it."""
    served = served_watch("preemption_deadline_s = 90\n")
    watch = served.watch
    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_preemption])
    assert main(["doctor"]) == 0
    assert capsys.readouterr().out == f"ok     gpuckptd watches for preemption: {node / 'preempt'}, SIGUSR1\n"

    served.signalled.set()  # SIGUSR1's notice: an empty drain (nothing recorded), then drained until a reset
    served.drained()
    view = watch.view()
    assert main(["doctor"]) == 0  # a warning fails nothing
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"warn   a preemption is pending in gpuckptd: notice at {view.noticed_at} from SIGUSR1, "
                        f"the node goes at (deadline) {view.deadline_at}; {view.drain}; periodic checkpoints and "
                        "idle reclaim wait and new notices are not watched")
    assert lines[1] == ("       fix: if the node stays: gpuckpt service restore (brings back what the drain left), "
                        "then gpuckpt service reset (watching again, without a restart)")
    assert main(["doctor", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["warned"] == 1 and shown["checks"][0]["check"] == "preemption"
    assert shown["checks"][0]["level"] == "warn"
    assert f"notice at {view.noticed_at}" in shown["checks"][0]["message"]
    assert f"(deadline) {view.deadline_at}" in shown["checks"][0]["message"]
    assert "gpuckpt service reset" in shown["checks"][0]["fix"]

    assert watch.reset().ok  # cleared: doctor says it watches again
    assert main(["doctor"]) == 0
    assert capsys.readouterr().out.startswith("ok     gpuckptd watches for preemption: ")


def test_no_service_answering_says_nothing_of_preemption(node: Path, monkeypatch) -> None:
    (node / "config.toml").write_text(f'[service]\nsocket = "{node / "absent.sock"}"\n')
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 0)
    assert doctor.check_preemption() is None  # check_service says whether it should run


@pytest.mark.skipif(os.geteuid() != 0, reason="gpuckptd's socket answers only root (SO_PEERCRED): CI runs as root")
def test_a_pending_preemption_from_a_file_still_there_says_to_remove_it_first(node: Path, monkeypatch,
                                                                             capsys, served_watch) -> None:
    """Operator trial c: the fix said restore, then reset, and the reset was then refused because the notice file
    was still there. The fix names the file first while it exists."""
    served = served_watch()
    notice = served.notice
    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_preemption])
    notice.touch()
    served.drained()
    assert main(["doctor"]) == 0
    fix = capsys.readouterr().out.splitlines()[1]
    assert fix == (f"       fix: if the node stays: remove {notice} (the notice; a reset is refused while it "
                   "exists), gpuckpt service restore (brings back what the drain left), then gpuckpt service reset "
                   "(watching again, without a restart)")
    notice.unlink()
    assert main(["doctor"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "       fix: if the node stays: gpuckpt service restore (brings back what the drain left), then gpuckpt "
        "service reset (watching again, without a restart)")
