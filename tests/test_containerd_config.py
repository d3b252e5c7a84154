"""gpuckpt's CRI runtime handler in containerd's config.toml (node/containerd.py) and doctor's check of it."""

import re
import tomllib

import pytest

from gpuckpt.cli import doctor
from gpuckpt.errors import EngineConfigError
from gpuckpt.node import containerd

RUNTIME = "/usr/bin/gpuckpt-runtime"
# Debian's containerd package's own file (forky, 2.1.9+ds1-5): config version 2.
DEBIAN_CONFIG = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""


def _entry(path, plugin: str) -> dict:
    return tomllib.loads(path.read_text())["plugins"][plugin]["containerd"]["runtimes"]["gpuckpt"]


def test_a_new_file_is_version_3_with_the_handler(tmp_path) -> None:
    config = tmp_path / "config.toml"
    change = containerd.register_containerd(RUNTIME, config_path=str(config))
    assert change.changed and change.backup is None
    assert tomllib.loads(config.read_text())["version"] == 3
    assert _entry(config, "io.containerd.cri.v1.runtime") == {"runtime_type": "io.containerd.runc.v2",
                                                               "pod_annotations": ["io.gpuckpt.*"],
                                                               "options": {"BinaryName": RUNTIME}}
    assert containerd.containerd_registration(str(config)) == (RUNTIME, "io.containerd.runc.v2")


def test_version_3_keeps_comments_other_runtimes_and_the_entrys_options_and_is_idempotent(tmp_path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("""version = 3
# the operator's note
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpuckpt.options]
    SystemdCgroup = true
    BinaryName = "/old/gpuckpt-runtime"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpuckpt]
    pod_annotations = ["example.com/*"]
""")
    first = containerd.register_containerd(RUNTIME, config_path=str(config))
    assert first.changed and first.backup and "/old/gpuckpt-runtime" in open(first.backup).read()
    text = config.read_text()
    assert "# the operator's note" in text
    settings = tomllib.loads(text)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert settings["default_runtime_name"] == "runc" and settings["runtimes"]["runc"]
    assert settings["runtimes"]["gpuckpt"] == {"runtime_type": "io.containerd.runc.v2",
                                               "pod_annotations": ["example.com/*", "io.gpuckpt.*"],
                                               "options": {"SystemdCgroup": True, "BinaryName": RUNTIME}}
    second = containerd.register_containerd(RUNTIME, config_path=str(config))
    assert not second.changed and config.read_text() == text
    assert len(list(tmp_path.glob("config.toml.gpuckpt-backup-*"))) == 1


def test_debians_version_2_file_gets_the_version_2_plugin(tmp_path) -> None:
    """containerd 2.x migrates a version 2 file when it loads it: the handler goes where version 2 keeps runtimes."""
    config = tmp_path / "config.toml"
    config.write_text(DEBIAN_CONFIG)
    assert containerd.register_containerd(RUNTIME, config_path=str(config)).changed
    settings = tomllib.loads(config.read_text())
    assert settings["version"] == 2
    assert settings["plugins"]["io.containerd.grpc.v1.cri"]["cni"]["conf_dir"] == "/etc/cni/net.d"
    assert settings["plugins"]["io.containerd.internal.v1.opt"] == {"path": "/var/lib/containerd/opt"}
    assert _entry(config, "io.containerd.grpc.v1.cri")["options"] == {"BinaryName": RUNTIME}
    assert "io.containerd.cri.v1.runtime" not in settings["plugins"]
    assert containerd.containerd_registration(str(config)) == (RUNTIME, "io.containerd.runc.v2")


@pytest.mark.parametrize("text, message", [
    ("[plugins.cri]\nsystemd_cgroup = true\n", "config version 1 (no `version` key is version 1): give version 2 or 3"),
    ("version = 4\n", "config version 4"),
    ("version = 3\n[plugins\n", "not valid TOML"),
    ("version = 3\n[plugins.'io.containerd.cri.v1.runtime']\ncontainerd = 1\n",
     "plugins.io.containerd.cri.v1.runtime.containerd must be a table"),
    ("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpuckpt]\npod_annotations = 'x'\n",
     "containerd.runtimes.gpuckpt.pod_annotations must be a list of strings"),
])
def test_a_file_it_cannot_edit_is_refused_untouched(tmp_path, text: str, message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    with pytest.raises(EngineConfigError, match="^" + re.escape(f"{config}: ") + ".*" + re.escape(message)):
        containerd.register_containerd(RUNTIME, config_path=str(config))
    assert config.read_text() == text
    assert not list(tmp_path.glob("*.gpuckpt-backup-*"))


def test_doctor_names_the_handler_or_the_fix(tmp_path, monkeypatch) -> None:
    config = tmp_path / "config.toml"
    assert doctor.check_containerd(str(config)) is None  # no file: nothing to check
    config.write_text("version = 3\n")
    monkeypatch.setattr(doctor, "_containerd_major", lambda: 1)  # docker's containerd 1.6: not a CRI node of ours
    assert doctor.check_containerd(str(config)) is None
    monkeypatch.setattr(doctor, "_containerd_major", lambda: 2)
    monkeypatch.setattr(doctor, "docker_registration", lambda: (None, False))
    with pytest.raises(doctor.CheckFailed, match="no CRI runtime handler 'gpuckpt'") as failure:
        doctor.check_containerd(str(config))
    assert failure.value.fix == f"gpuckpt install --engine containerd --config {config}"
    # docker 28's containerd 2.1 (its config file too) beside a docker that runs gpuckpt-runtime: a warning
    monkeypatch.setattr(doctor, "docker_registration", lambda: (str(tmp_path / "gpuckpt-runtime"), False))
    with pytest.raises(doctor.CheckWarned, match="Kubernetes pods on this node do not go through gpuckpt") as warned:
        doctor.check_containerd(str(config))
    assert warned.value.fix == f"gpuckpt install --engine containerd --config {config}"
    runtime = tmp_path / "gpuckpt-runtime"
    runtime.write_text("#!/bin/sh\n")
    runtime.chmod(0o755)
    containerd.register_containerd(str(runtime), config_path=str(config))
    expected = f"containerd: CRI runtime handler 'gpuckpt' runs {runtime} ({config})"
    assert doctor.check_containerd(str(config)) == expected
    runtime.chmod(0o644)
    with pytest.raises(doctor.CheckFailed, match="not an executable gpuckpt-runtime"):
        doctor.check_containerd(str(config))
