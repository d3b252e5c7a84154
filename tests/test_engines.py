"""Registering the runtime in podman's and docker's own config files."""

import json
from pathlib import Path

import pytest

from gpuckpt.cli import install
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


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_podman_registration_stands_in_for_every_runtime_the_shim_delegates_to(tmp_path, monkeypatch) -> None:
    """With --default, each runtime podman knows that the node has and the shim can delegate to (runc, crun) runs
    the shim, through a link of its name (the shim delegates by that name): an archive naming either goes through
    the shim's checks under podman's own restore --import. Another runtime (kata) is left as it is and named."""
    runtime = executable(tmp_path / "usr" / "bin" / "gpuckpt-runtime")
    executable(tmp_path / "sbin" / "runc")
    executable(tmp_path / "local" / "crun")
    kata = executable(tmp_path / "opt" / "kata" / "kata-runtime")
    monkeypatch.setenv("PATH", f"{tmp_path / 'usr' / 'bin'}:{tmp_path / 'sbin'}:{tmp_path / 'local'}")
    conf = tmp_path / "etc" / "containers.conf"
    conf.parent.mkdir()
    conf.write_text(f'[engine.runtimes]\ncrun = ["/nonexistent/crun", "{tmp_path / "local" / "crun"}"]\n'
                    f'kata = ["{kata}"]\nyouki = ["/nonexistent/youki"]\n')
    assert install._stand_ins(False, str(runtime), str(conf)) == ([], [])
    names, others = install._stand_ins(True, str(runtime), str(conf))
    assert (names, others) == (["runc", "crun"], ["kata"])
    links = engines.stand_in_links(str(runtime), names, str(conf))
    assert links == {name: str(tmp_path / "etc" / engines.STAND_IN_DIR / name) for name in names}
    assert engines.register_podman(str(runtime), default=True, conf_path=str(conf), stand_in_for=links).changed
    table = engines.podman_runtimes(str(conf))
    assert table["runc"] == [links["runc"]] and table["crun"] == [links["crun"]] and table["kata"] == [str(kata)]
    assert all(engines.stands_in(table[name], str(runtime)) for name in ("runc", "crun", "gpuckpt-runtime"))
    assert not engines.stands_in(table["kata"], str(runtime))
    # again: the same links and table, the names found still (their links are the shim, skipped on PATH)
    assert install._stand_ins(True, str(runtime), str(conf)) == (["runc", "crun"], ["kata"])
    assert engines.stand_in_links(str(runtime), names, str(conf)) == links
    assert not engines.register_podman(str(runtime), default=True, conf_path=str(conf), stand_in_for=links).changed
