"""`gpuckpt doctor`'s checks: a node without CRIU's image definitions, or whose gpuckptd unit is not
enabled or not running under systemd, is told, with the fix; checks that cannot apply say nothing."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuckpt.cli import doctor
from gpuckpt.node import engines
from gpuckpt.node.config import load_config
from gpuckpt.oci import criu_images
from gpuckpt.service.api import Status
from gpuckpt.shim.resident.call import socket_path


@pytest.fixture
def pycriu_looked_up() -> Iterator[None]:
    """criu_messages loads the bindings once a process: the check looks them up again, here and after the test."""
    criu_images.criu_messages.cache_clear()
    yield
    criu_images.criu_messages.cache_clear()


def test_missing_image_definitions_fail_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      pycriu_looked_up: None) -> None:
    nowhere = (str(tmp_path / "opt-criu" / "pycriu" / "images"), str(tmp_path / "dist-packages" / "pycriu" / "images"))
    monkeypatch.setattr(criu_images, "PYCRIU_DIRS", nowhere)  # the bindings' places on a node without them
    with pytest.raises(doctor.CheckFailed) as failed:
        doctor.check_criu_image_definitions()
    assert str(failed.value) == ("cannot check CRIU images: CRIU's python bindings (python3-pycriu) are not installed "
                                 f"(looked in {nowhere[0]}, {nowhere[1]})")
    assert failed.value.fix.startswith("install Debian's python3-pycriu")


def test_installed_image_definitions_pass(pycriu_looked_up: None) -> None:
    if not any(os.path.isdir(path) for path in criu_images.PYCRIU_DIRS):
        pytest.skip(f"no python3-pycriu in {', '.join(criu_images.PYCRIU_DIRS)} (install-system.sh installs it)")
    said = doctor.check_criu_image_definitions()
    assert said == "CRIU's image definitions (python3-pycriu) load: restores can be checked"


# --- the service check (gpuckptd's unit under systemd) ----------------------------------------------

ACTIVE = {"LoadState": "loaded", "UnitFileState": "enabled", "ActiveState": "active", "SubState": "running",
          "StatusText": "serving /run/gpuckpt/gpuckptd.sock"}


@pytest.fixture
def systemd(node: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], None]:
    """PID 1 is systemd and `systemctl show gpuckptd.service` answers what the test sets."""
    (node / "systemd").mkdir()
    monkeypatch.setattr(doctor, "SYSTEMD_RUN_DIR", str(node / "systemd"))
    monkeypatch.setattr(doctor, "find_program", lambda name: f"/usr/bin/{name}")

    def answer(properties: dict[str, str]) -> None:
        monkeypatch.setattr(doctor, "_unit_properties", lambda unit, *names: dict(properties))
    return answer


def serve_once(node: Path, reply: bytes | None) -> threading.Thread:
    """gpuckptd's socket as the config names it: one connection, `reply` after the request line (None:
    never answers)."""
    path = node / "api.sock"
    (node / "config.toml").write_text(f'[service]\nsocket = "{path}"\n')
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        connection, _ = listener.accept()
        connection.settimeout(None)  # not the client's default, which the check sets while it asks
        with connection, listener:
            connection.recv(4096)
            if reply is None:
                connection.recv(4096)  # until the client gives up
            else:
                connection.sendall(reply)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_service_check_is_silent_without_the_unit(systemd) -> None:
    systemd({"LoadState": "not-found", "UnitFileState": "", "ActiveState": "inactive"})
    assert doctor.check_service() is None  # installed from source: no unit


def test_without_systemd_a_service_not_answering_is_a_warning_naming_the_foreground(node, monkeypatch) -> None:
    """PID 1 is not systemd and nothing answers on service.socket: doctor said nothing of gpuckptd (issue 33,
    met again in the operator trial of 2026-11-28); now a warning whose fix is the foreground mode."""
    monkeypatch.setattr(doctor, "SYSTEMD_RUN_DIR", "/nonexistent/systemd/system")
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 0)
    (node / "config.toml").write_text(f'[service]\nsocket = "{node / "absent.sock"}"\n')
    with pytest.raises(doctor.CheckWarned) as warned:
        doctor.check_service()
    assert str(warned.value).startswith(f"gpuckptd does not answer on {node / 'absent.sock'} and systemd is not PID 1")
    assert warned.value.fix.startswith("run gpuckptd in the foreground")


def test_without_systemd_a_service_answering_is_named(node, monkeypatch) -> None:
    monkeypatch.setattr(doctor, "SYSTEMD_RUN_DIR", "/nonexistent/systemd/system")
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "_ask_status", lambda socket_path: Status(recorded=["a" * 64], drained=[]))
    assert doctor.check_service() == (f"gpuckptd answers on {load_config().service.socket} (in the foreground: "
                                      "systemd is not PID 1): 1 container(s) recorded, 0 drained waiting")


def test_a_bad_config_value_fails_one_check_and_skips_the_others_reading_it(node, monkeypatch) -> None:
    """One bad value was three FAIL lines with the same words (config, hook, preemption): one FAIL, the others
    skipped naming why."""
    monkeypatch.setattr(doctor, "SYSTEMD_RUN_DIR", "/nonexistent/systemd/system")
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_config_and_delegate, doctor.check_service,
                                           doctor.check_preemption])
    (node / "config.toml").write_text("[service]\ncheckpoint_every_min = -1\n")
    checks = doctor.report().checks
    failed = [check for check in checks if check.level == "fail"]
    assert [check.check for check in failed] == ["config_and_delegate"], failed
    assert "service.checkpoint_every_min = -1" in failed[0].message
    skipped = {check.check: check.message for check in checks if "configuration does not load" in check.message}
    assert sorted(skipped) == ["preemption", "service"], checks
    assert all(check.level == "skip" for check in checks if check.check in skipped), checks


@pytest.mark.parametrize(("properties", "said", "fix"), [
    ({"UnitFileState": "disabled"}, "is disabled: it does not start at boot", "systemctl enable --now gpuckptd"),
    ({"UnitFileState": "masked", "ActiveState": "inactive"}, "is masked", "systemctl unmask gpuckptd"),
    ({"ActiveState": "failed", "SubState": "failed"}, "is failed (failed): nothing drains", "systemctl start gpuckptd"),
])
def test_service_not_enabled_or_not_running_fails_with_the_fix(systemd, properties, said, fix) -> None:
    systemd({**ACTIVE, **properties})
    with pytest.raises(doctor.CheckFailed, match=re.escape(said)) as failed:
        doctor.check_service()
    assert failed.value.fix.startswith(fix)


def test_active_service_reports_its_status_and_what_waits(systemd, node, monkeypatch) -> None:
    systemd(ACTIVE)
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 0)
    status = Status(recorded=["a1", "b2"], drained=["c3"], busy=None)
    serve_once(node, status.model_dump_json().encode() + b"\n")
    line = doctor.check_service()
    assert line == ("gpuckptd.service enabled, active: serving /run/gpuckpt/gpuckptd.sock; drains at stop; "
                    "2 container(s) recorded, 1 drained waiting for a restore")


def test_active_service_whose_api_hangs_fails_within_the_timeout(systemd, node, monkeypatch) -> None:
    systemd(ACTIVE)
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "STATUS_TIMEOUT_S", 0.2)
    serve_once(node, None)
    with pytest.raises(doctor.CheckFailed, match="active but its API does not answer") as failed:
        doctor.check_service()
    assert "journalctl -u gpuckptd" in failed.value.fix
    assert socket.getdefaulttimeout() is None  # the process's default is left as it was


# --- the resident helper (gpuckpt-runtimed): in use, or owned verbs in-process at a cost ----------------

BENCH = Path(__file__).resolve().parents[1] / "results" / "bench" / "owned_verbs.json"


@pytest.fixture
def helper_socket(node: Path) -> Iterator[socket.socket]:
    """A real listener on the helper's socket path (the node's state dir is the test's own)."""
    Path(socket_path()).parent.mkdir(exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path())
    listener.listen()
    with listener:
        yield listener


def test_absent_helper_is_a_warning_with_its_cost_and_the_unit_to_enable(systemd) -> None:
    with pytest.raises(doctor.CheckWarned, match="resident helper is not in use") as warned:
        doctor.check_resident_helper()
    said = str(warned.value)
    assert socket_path() in said and "nothing listens" in said
    assert (f"run in-process, ~{doctor.IN_PROCESS_ADDED_MS} ms each over runc's instead of "
            f"~{doctor.RESIDENT_ADDED_MS} ms") in said
    assert warned.value.fix == "systemctl enable --now gpuckpt-runtimed.socket"


def test_absent_helper_without_systemd_names_the_helper_to_start(node, monkeypatch) -> None:
    monkeypatch.setattr(doctor, "SYSTEMD_RUN_DIR", str(node / "no-systemd"))
    with pytest.raises(doctor.CheckWarned) as warned:
        doctor.check_resident_helper()
    assert "start gpuckpt-runtimed" in warned.value.fix


@pytest.mark.skipif(os.geteuid() != 0, reason="the runtime hands verbs only to a root listener: this one is ours")
def test_listening_helper_the_runtime_would_use_is_ok(helper_socket) -> None:
    said = doctor.check_resident_helper()
    assert said.startswith(f"gpuckpt-runtimed listens on {socket_path()}")
    assert f"~{doctor.RESIDENT_ADDED_MS} ms each" in said


@pytest.mark.skipif(os.geteuid() == 0, reason="needs a listener that is not root: run as another user")
def test_listener_the_runtime_would_refuse_is_a_warning(helper_socket) -> None:
    with pytest.raises(doctor.CheckWarned, match=f"its listener uid {os.geteuid()}"):
        doctor.check_resident_helper()


def test_warning_is_printed_as_such_and_fails_nothing(systemd, monkeypatch, capsys) -> None:
    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_resident_helper])
    assert doctor.run(argparse.Namespace(containerd_config=doctor.CONTAINERD_CONFIG, json=False)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("warn   the runtime's resident helper is not in use")
    assert lines[1] == "       fix: systemctl enable --now gpuckpt-runtimed.socket"


def test_the_costs_doctor_quotes_are_the_committed_bench_figures() -> None:
    """Rounded to 10 ms, the larger of checkpoint's and restore's added medians (bench/owned_verbs.py)."""
    bench = json.loads(BENCH.read_text())
    in_process = max(bench["checkpoint_added_in_process_ms"], bench["restore_added_in_process_ms"])
    resident = max(bench["checkpoint_added_ms"], bench["restore_added_ms"])
    assert (doctor.IN_PROCESS_ADDED_MS, doctor.RESIDENT_ADDED_MS) == (round(in_process, -1), round(resident, -1))


def test_runtimes_podman_would_run_past_the_shim_are_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """podman's own restore --import runs the runtime an archive names: each installed one whose name is not
    the shim's is named, with the checked path as the fix."""
    conf = tmp_path / "containers.conf"
    conf.write_text('[engine.runtimes]\ngpuckpt-runtime = ["/usr/bin/gpuckpt-runtime"]\n'
                    'runc = ["/usr/bin/gpuckpt-runtime"]\n')
    monkeypatch.setattr(engines, "PODMAN_CONF", str(conf))
    monkeypatch.setattr(doctor, "podman_registration", lambda: engines.podman_registration(str(conf)))
    monkeypatch.setattr(doctor, "podman_runtimes", lambda: engines.podman_runtimes(str(conf)))
    installed = {"podman", "runc", "crun"}
    monkeypatch.setattr(doctor, "find_program", lambda name: f"/usr/bin/{name}" if name in installed else None)
    with pytest.raises(doctor.CheckWarned, match=r"names crun \(or a runtime by path\) with that runtime") as warned:
        doctor.check_podman_runtime_names()
    assert "gpuckpt import" in warned.value.fix
    installed.discard("crun")
    assert "every installed runtime name resolves to gpuckpt-runtime" in doctor.check_podman_runtime_names()
