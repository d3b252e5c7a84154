"""Annotations runc acts on, the CRIU config file a container may name, and policies only tightened.

The config files are real files checked through real descriptors; root is needed to own them.
"""

from __future__ import annotations

import os

import pytest

from gpuckpt.node.config import CriuConfig, CudaConfig
from gpuckpt.policy.annotations import (
    PolicyError,
    criu_config_file_problem,
    refuse_runtime_annotations,
    unrestorable_allowed,
)
from gpuckpt.policy.network import container_policy

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="root-owned files need root (CI runs as root)")
ALLOWED = CriuConfig(allow_container_config=True)


def refuse(annotations: dict[str, str], criu: CriuConfig = ALLOWED, dirs=()) -> str:
    with pytest.raises(PolicyError) as raised:
        refuse_runtime_annotations(annotations, "ctr", criu, "/etc/gpuckpt/config.toml", dirs)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("container ctr carries the annotation ")
    return message


@pytest.mark.hostile("annotation key org.criu.config=<path>: runc's label split makes it a CRIU config file")
@pytest.mark.parametrize("key", ["org.criu.config=/tmp/evil.conf", "org.criu.config=", "bundle=/tmp/other",
                                 "org.systemd.property.KillSignal=9"])
def test_a_key_runc_would_split_into_one_it_acts_on_is_refused_even_when_allowed(key) -> None:
    name = key.partition("=")[0]
    message = refuse({key: "x"})
    assert f"would act on it as {name}; a key that starts with {name}= is refused" in message


@pytest.mark.hostile("annotation bundle=<dir>: runc would take the container's bundle path")
def test_the_bundle_label_is_refused() -> None:
    assert "runc keeps the bundle's path under that label" in refuse({"bundle": "/tmp/elsewhere"})


@pytest.mark.hostile("annotation org.systemd.property.DeviceAllow: a unit property granting devices")
def test_systemd_properties_other_than_the_engines_are_refused() -> None:
    message = refuse({"org.systemd.property.DeviceAllow": "[('/dev/sda', 'rwm')]"})
    assert "on the container's systemd unit; refused (allowed: org.systemd.property.After" in message


def test_the_properties_engines_set_and_other_annotations_pass() -> None:
    refuse_runtime_annotations({"org.systemd.property.KillSignal": "15", "org.systemd.property.TimeoutStopUSec":
                                "uint64 10000000", "io.container.manager": "libpod", "key=with=equals": "v"},
                               "ctr", CriuConfig(), "config.toml")


@pytest.mark.hostile("annotation org.criu.config on a node whose operator did not allow it")
def test_a_criu_config_is_refused_unless_the_operator_allows_it() -> None:
    message = refuse({"org.criu.config": "/etc/criu/site.conf"}, CriuConfig())
    assert message.endswith("a CRIU configuration chosen by the container is refused; the operator may allow it "
                            "with criu.allow_container_config = true in /etc/gpuckpt/config.toml")


@pytest.fixture
def site(tmp_path):
    """A root-only directory (the operator's) with a root-owned config file in it."""
    directory = tmp_path / "criu"
    directory.mkdir(mode=0o755)
    config = directory / "site.conf"
    config.write_text("log-file=x.log\n")
    config.chmod(0o644)
    return directory, config


def allowing(directory) -> CriuConfig:
    return CriuConfig(allow_container_config=True, container_config_dirs=(str(directory),))


@needs_root
def test_an_allowed_file_passes_and_the_reason_is_empty(site) -> None:
    directory, config = site
    refuse_runtime_annotations({"org.criu.config": str(config)}, "ctr", allowing(directory), "c.toml")
    assert criu_config_file_problem(str(config), [str(directory)], []) is None


@needs_root
@pytest.mark.hostile("org.criu.config naming a file that is not the operator's")
@pytest.mark.parametrize("make, reason", [
    (lambda d, f: f.chmod(0o664), "is writable by group or others (mode 0664)"),
    (lambda d, f: os.chown(f, 65534, 65534), "is owned by uid 65534, not root"),
    (lambda d, f: d.chmod(0o777), "criu is writable by group or others (mode 0777)"),
    (lambda d, f: (f.unlink(), f.symlink_to("/etc/passwd")), "Too many levels of symbolic links (links are not "
                                                             "followed)"),
    (lambda d, f: (f.unlink(), os.mkfifo(f)), "not a regular file"),
    (lambda d, f: f.unlink(), "No such file or directory"),
])
def test_a_file_not_owned_and_guarded_by_root_is_refused(site, make, reason) -> None:
    directory, config = site
    make(directory, config)
    message = refuse({"org.criu.config": str(config)}, allowing(directory))
    assert reason in message and "allowed: a regular file owned by root and writable by root only, in " in message


@needs_root
@pytest.mark.hostile("org.criu.config whose directory is reached through a symlink")
def test_a_linked_directory_on_the_way_is_refused(site, tmp_path) -> None:
    directory, config = site
    os.symlink(directory, tmp_path / "linked")
    message = refuse({"org.criu.config": str(tmp_path / "linked" / "site.conf")}, allowing(tmp_path))
    assert "linked: Not a directory (links are not followed)" in message


@needs_root
def test_a_sticky_directory_is_accepted_on_the_way(site) -> None:
    """Like /tmp: others may add entries, never rename or remove root's (runc's own test uses /tmp)."""
    directory, config = site
    directory.chmod(0o1777)
    assert criu_config_file_problem(str(config), [str(directory)], []) is None


@needs_root
@pytest.mark.hostile("org.criu.config outside the listed directories, in container storage, or a relative path")
@pytest.mark.parametrize("path, reason", [
    ("/etc/passwd", "not in a directory the operator lists"),
    ("{d}/../criu/site.conf", "not an absolute, normalised path"),
    ("site.conf", "not an absolute, normalised path"),
    ("", "it names no file"),
    ("{d}/site.conf", "inside container storage"),
])
def test_paths_outside_what_the_operator_lists_are_refused(site, path, reason) -> None:
    directory, _ = site
    message = refuse({"org.criu.config": path.format(d=directory)}, allowing(directory), dirs=[str(directory)])
    assert f": {reason}" in message


@pytest.mark.hostile("io.gpuckpt.criu.* annotation looser than the operator's setting")
@pytest.mark.parametrize("operator, key, value", [
    (CriuConfig(tcp_established="never"), "io.gpuckpt.criu.tcp-established", "always"),
    (CriuConfig(tcp_established="never"), "io.gpuckpt.criu.tcp-established", "auto"),
    (CriuConfig(), "io.gpuckpt.criu.tcp-established", "always"),
    (CriuConfig(file_locks="never"), "io.gpuckpt.criu.file-locks", "auto"),
    (CriuConfig(ext_unix_sk="never"), "io.gpuckpt.criu.ext-unix-sk", "auto"),
])
def test_an_annotation_may_not_loosen_the_operators_policy(operator, key, value) -> None:
    with pytest.raises(PolicyError) as raised:
        container_policy(operator, {key: value}, "ctr")
    assert str(raised.value).startswith(f"container ctr carries the annotation {key}={value!r}, looser than the "
                                        "operator's")
    assert "a container may only tighten the operator's policy (allowed here: never" in str(raised.value)


def test_an_annotation_may_tighten_it() -> None:
    assert container_policy(CriuConfig(tcp_established="always"), {"io.gpuckpt.criu.tcp-established": "never"},
                            "ctr").tcp_established == "never"
    assert container_policy(CriuConfig(), {"io.gpuckpt.criu.file-locks": "never",
                                           "io.gpuckpt.criu.tcp-established": "auto"}, "ctr").file_locks == "never"


@pytest.mark.hostile("io.gpuckpt.allow-unrestorable=true where the operator said never")
def test_allow_unrestorable_annotation_under_an_operators_never_is_refused() -> None:
    with pytest.raises(PolicyError, match='allow-unrestorable=true; the operator\'s cuda.allow_unrestorable = "never" '
                                          'refuses it'):
        unrestorable_allowed(CudaConfig(allow_unrestorable="never"), {"io.gpuckpt.allow-unrestorable": "true"}, "ctr")
    assert not unrestorable_allowed(CudaConfig(allow_unrestorable="never"), {}, "ctr")
    assert unrestorable_allowed(CudaConfig(), {"io.gpuckpt.allow-unrestorable": "true"}, "ctr")
    assert not unrestorable_allowed(CudaConfig(), {}, "ctr")
    assert unrestorable_allowed(CudaConfig(allow_unrestorable=True), {}, "ctr")

