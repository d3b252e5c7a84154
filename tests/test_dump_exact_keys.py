"""config.dump and spec.dump read as podman reads them: Go's encoding/json fills a field from a key
that only case-folds to its name, so such a key is refused, never skipped by our models."""

from __future__ import annotations

import json

import pytest
from podman_tars import CONFIG, PODMAN_LINUX, podman_tar

from gpuckpt.errors import ImageError
from gpuckpt.oci.podman_archive import check_podman_archive
from gpuckpt.policy.archive_import import import_refusals
from gpuckpt.policy.image import parse_grant

PODMAN_ID = "c0ffee" * 10 + "abcd"
USERDATA = f"/var/lib/containers/storage/overlay-containers/{PODMAN_ID}/userdata"
HOOK = {"prestart": [{"path": "/tmp/evil"}]}


def honest_spec() -> dict:
    return {"ociVersion": "1.0.2",
            "process": {"user": {"uid": 0, "gid": 0}, "noNewPrivileges": True,
                        "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"], "effective": ["CAP_CHOWN"]}},
            "mounts": [{"destination": "/etc/hosts", "type": "bind", "source": f"{USERDATA}/hosts",
                        "options": ["bind", "private"]}],
            "linux": PODMAN_LINUX | {"mountLabel": ""},
            "annotations": {"Hooks": "an annotation's name is free", "io.podman.annotations.privileged": "FALSE"}}


def honest_config() -> dict:
    # podman's own capitalised keys (ContainerSecurityConfig, the healthcheck) are its, not the spec's;
    # secrets are this node's, refused (test_podman_archive)
    return json.loads(CONFIG) | {"id": PODMAN_ID, "spec": honest_spec(), "MountLabel": "", "ProcessLabel": "",
                                 "healthcheck": {"Test": ["CMD", "true"], "Timeout": 30}}


def archive(tmp_path, config: dict, spec: dict) -> str:
    path = tmp_path / "exact-keys.tar"
    path.write_bytes(podman_tar(config=json.dumps(config).encode(), spec=json.dumps(spec).encode()))
    return str(path)


def test_an_honest_podman_archive_passes(tmp_path) -> None:
    checked = check_podman_archive(archive(tmp_path, honest_config(), honest_spec()))
    assert import_refusals(checked) == [] and checked.config.name == "web"
    assert parse_grant(checked.spec_bytes, "spec.dump").process.noNewPrivileges


def spec_with(**changes) -> dict:
    return honest_spec() | changes


def process_renamed() -> dict:
    spec = honest_spec()
    spec["Process"] = spec.pop("process") | {"capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}
    return spec


@pytest.mark.parametrize("where, config, spec, key", [
    pytest.param("spec.dump", {}, spec_with(Hooks=HOOK), "'Hooks' in the top level is 'hooks'",
                 marks=pytest.mark.hostile("spec.dump with an OCI hook under the key \"Hooks\"")),
    pytest.param("spec.dump", {}, spec_with(**{"hoo\u212as": HOOK}), "'hoo\\u212as' in the top level is 'hooks'",
                 marks=pytest.mark.hostile("spec.dump with an OCI hook under \"hooks\" spelled with the Kelvin sign")),
    pytest.param("spec.dump", {}, spec_with(HOOKS=HOOK, hooks=None), "keys 'HOOKS' and 'hooks' in one object",
                 marks=pytest.mark.hostile("spec.dump with \"HOOKS\" and \"hooks\" in one object")),
    pytest.param("spec.dump", {}, process_renamed(), "'Process' in the top level is 'process'",
                 marks=pytest.mark.hostile("spec.dump whose process (capabilities) is under the key \"Process\"")),
    pytest.param("spec.dump", {}, spec_with(process={"Capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}),
                 "'Capabilities' in process is 'capabilities'",
                 marks=pytest.mark.hostile("spec.dump whose capabilities are under \"Capabilities\"")),
    pytest.param("spec.dump", {}, spec_with(Mounts=[{"destination": "/h", "type": "bind", "source": "/"}]),
                 "keys 'mounts' and 'Mounts' in one object",
                 marks=pytest.mark.hostile("spec.dump with a host bind mount under the key \"Mounts\"")),
    pytest.param("config.dump", {"Privileged": True}, honest_spec(), "'Privileged' in the top level is 'privileged'",
                 marks=pytest.mark.hostile("config.dump asking for a privileged container under \"Privileged\"")),
    pytest.param("config.dump", {"spec": spec_with(Hooks=HOOK)}, honest_spec(), "'Hooks' in spec is 'hooks'",
                 marks=pytest.mark.hostile("config.dump whose embedded spec has an OCI hook under \"Hooks\"")),
    pytest.param("config.dump", {"spec": spec_with(linux={"Devices": [{"path": "/dev/sda"}]})}, honest_spec(),
                 "'Devices' in spec.linux is 'devices'",
                 marks=pytest.mark.hostile("config.dump whose embedded spec gives a device under \"Devices\"")),
])
def test_keys_that_only_fold_to_a_field_are_refused_with_one_line(tmp_path, where, config, spec, key) -> None:
    path = archive(tmp_path, honest_config() | config, spec)
    with pytest.raises(ImageError) as refused:
        check_podman_archive(path)
    line = str(refused.value)
    assert line.startswith(f"{path}: {where}: ") and key in line and "keys must be spelled exactly" in line
    assert "\n" not in line


@pytest.mark.hostile("spec.dump whose process.user is under \"User\" (the capability check reads spec.dump alone)")
def test_the_capability_check_reads_spec_dump_as_exactly() -> None:
    spec = honest_spec()
    spec["process"]["User"] = spec["process"].pop("user")
    with pytest.raises(ImageError, match=r"^a.tar: spec.dump: key 'User' in process is 'user' spelled otherwise; "
                                         "keys must be spelled exactly$"):
        parse_grant(json.dumps(spec).encode(), "a.tar: spec.dump")
