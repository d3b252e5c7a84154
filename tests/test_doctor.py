"""`gpuckpt doctor`'s checks: a node without CRIU's image definitions, or whose gpuckptd unit is not
enabled or not running under systemd, is told, with the fix; checks that cannot apply say nothing."""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuckpt.cli import doctor
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


def test_service_check_is_silent_without_systemd_or_without_the_unit(systemd, monkeypatch) -> None:
    systemd({"LoadState": "not-found", "UnitFileState": "", "ActiveState": "inactive"})
    assert doctor.check_service() is None  # installed from source: no unit
    monkeypatch.setattr(doctor, "SYSTEMD_RUN_DIR", "/nonexistent/systemd/system")
    assert doctor.check_service() is None  # PID 1 is not systemd


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


def test_resident_helper_check_says_whether_it_listens(node) -> None:
    assert "does not listen" in doctor.check_resident_helper()
    Path(socket_path()).parent.mkdir(exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path())
    listener.listen()
    try:
        assert doctor.check_resident_helper().startswith(f"gpuckpt-runtimed listens on {socket_path()}")
    finally:
        listener.close()
