"""Registering the runtime in podman's and docker's own config files."""

import json
import tomllib

import pytest

from gpuckpt.errors import EngineConfigError
from gpuckpt.node import engines


def test_podman_registration_keeps_user_settings_and_is_idempotent(tmp_path) -> None:
    conf = tmp_path / "containers.conf"
    conf.write_text('# my comment\n[containers]\ndefault_ulimits = ["nofile=16384:16384"]\n')
    first = engines.register_podman("/usr/local/bin/gpuckpt-runtime", default=True, conf_path=str(conf))
    assert first.changed and first.backup
    text = conf.read_text()
    assert "# my comment" in text and "nofile=16384:16384" in text
    assert engines.podman_registration(str(conf)) == (["/usr/local/bin/gpuckpt-runtime"], True)
    second = engines.register_podman("/usr/local/bin/gpuckpt-runtime", default=True, conf_path=str(conf))
    assert not second.changed and conf.read_text() == text
    assert len(list(tmp_path.glob("containers.conf.gpuckpt-backup-*"))) == 1


def test_docker_registration(tmp_path) -> None:
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"log-driver": "json-file", "runtimes": {"nvidia": {"path": '
                      '"/usr/bin/nvidia-container-runtime"}}}')
    assert engines.register_docker("/x/gpuckpt-runtime", default=False, daemon_json=str(daemon)).changed
    settings = json.loads(daemon.read_text())
    assert settings["log-driver"] == "json-file" and "nvidia" in settings["runtimes"]
    assert settings["runtimes"]["gpuckpt-runtime"] == {"path": "/x/gpuckpt-runtime"}
    assert settings["experimental"] is True and "default-runtime" not in settings
    assert not engines.register_docker("/x/gpuckpt-runtime", default=False, daemon_json=str(daemon)).changed


def test_broken_daemon_json_is_refused_untouched(tmp_path) -> None:
    daemon = tmp_path / "daemon.json"
    daemon.write_text("{not json")
    with pytest.raises(EngineConfigError, match=f"{daemon}: not valid JSON"):
        engines.register_docker("/x", default=False, daemon_json=str(daemon))
    assert daemon.read_text() == "{not json"


def test_podman_registration_can_stand_in_for_the_delegates_name(tmp_path) -> None:
    """With --default, podman's own name for the delegate resolves to the shim too: an archive naming runc
    goes through the shim's checks under podman's own restore --import."""
    conf = tmp_path / "containers.conf"
    conf.write_text('[engine.runtimes]\ncrun = ["/usr/bin/crun"]\n')
    assert engines.register_podman("/usr/bin/gpuckpt-runtime", default=True, conf_path=str(conf),
                                   stand_in_for="runc").changed
    runtimes = tomllib.loads(conf.read_text())["engine"]["runtimes"]
    assert runtimes == {"crun": ["/usr/bin/crun"], "gpuckpt-runtime": ["/usr/bin/gpuckpt-runtime"],
                        "runc": ["/usr/bin/gpuckpt-runtime"]}
