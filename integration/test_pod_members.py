"""A container of a podman pod, moved with `gpuckpt export` and `gpuckpt import --pod`, and the "not found"
statuses of the commands that name a container or pod, with real podman 4.3 (issue 33).

podman 4.3's restore looks `--pod NAME` up by name, then adds the container to the pod by that name as if it
were its ID ("pod with ID NAME not found", exit 5): gpuckpt gives podman the pod's ID. An archive of a pod's
container restores only into a pod, one of no pod only outside one: said before anything is staged. A
container or pod podman does not know exits 4 (not found, cli/exit_codes.py), not 5 (engine failed).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bed import GPUCKPT, PODMAN_IMAGE, sh, staging_leftovers

pytestmark = pytest.mark.integration
SLEEPER = "import time; time.sleep(100000)"


def unique(what: str) -> str:
    return f"h33-{what}-{os.getpid()}"


def pod_with_member(pod: str, member: str) -> None:
    """A pod with its infra container (sharing net, ipc, uts) and one running member."""
    sh("podman", "pod", "create", "--name", pod)
    sh("podman", "run", "-d", "--pod", pod, "--name", member, PODMAN_IMAGE, "python3", "-c", SLEEPER)
    deadline = time.monotonic() + 30
    while sh("podman", "exec", member, "true", check=False).returncode != 0:
        assert time.monotonic() < deadline, "the pod's member did not start"


def net_namespace(container: str) -> str:
    pid = sh("podman", "inspect", "--format", "{{.State.Pid}}", container).stdout.strip()
    return os.readlink(f"/proc/{pid}/ns/net")


@pytest.fixture(scope="module")
def member_archive(tmp_path_factory) -> Iterator[Path]:
    """The archive `gpuckpt export` wrote of a pod's member (the member and its pod removed after)."""
    pod, member = unique("srcpod"), unique("member")
    archive = tmp_path_factory.mktemp("h33-pod") / "member.tar.zst"
    try:
        pod_with_member(pod, member)
        exported = sh(GPUCKPT, "export", member, "-o", str(archive), check=False, timeout=300)
        assert exported.returncode == 0, exported.stderr
        yield archive
    finally:
        sh("podman", "pod", "rm", "-f", pod, check=False)


@pytest.fixture
def target_pod() -> Iterator[str]:
    """An empty pod of the same shape (its infra container shares net, ipc, uts), removed with what joined it."""
    pod = unique("dstpod")
    sh("podman", "pod", "create", "--name", pod)
    sh("podman", "pod", "start", pod)
    yield pod
    sh("podman", "pod", "rm", "-f", pod, check=False)


def test_a_pod_member_imports_into_a_pod_given_by_name(member_archive: Path, target_pod: str) -> None:
    name = unique("inpod")
    # without --pod: podman would refuse it only after the archive is checked and staged
    before = set(staging_leftovers())
    refused = sh(GPUCKPT, "import", str(member_archive), "--name", name, "--trust-config", check=False, timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"gpuckpt import: {member_archive}: its container was in a pod (ID "), \
        refused.stderr
    assert "give --pod POD" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert set(staging_leftovers()) <= before
    # --pod by name (podman 4.3 took it for an ID: exit 5); the namespaces the archive names are its old pod's
    # infra container's, which podman replaces by the target pod's: hence --trust-config, as the policy asks
    restored = sh(GPUCKPT, "import", str(member_archive), "--name", name, "--pod", target_pod, "--trust-config",
                  check=False, timeout=300)
    assert restored.returncode == 0, restored.stderr
    pod_id = sh("podman", "pod", "inspect", "--format", "{{.ID}}", target_pod).stdout.strip()
    assert sh("podman", "inspect", "--format", "{{.Pod}} {{.State.Running}}", name).stdout.split() == [pod_id, "true"]
    infra = sh("podman", "pod", "inspect", "--format", "{{.InfraContainerID}}", target_pod).stdout.strip()
    assert net_namespace(name) == net_namespace(infra), "the restored member is not in its new pod's network"


def test_an_archive_of_no_pod_is_refused_into_a_pod_before_anything(tmp_path: Path, target_pod: str) -> None:
    plain, archive = unique("plain"), tmp_path / "plain.tar.zst"
    sh("podman", "run", "-d", "--name", plain, "--network", "none", PODMAN_IMAGE, "python3", "-c", SLEEPER)
    try:
        sh(GPUCKPT, "export", plain, "-o", str(archive), timeout=300)
    finally:
        sh("podman", "rm", "-f", "-t", "0", plain, check=False)
    before = set(staging_leftovers())
    refused = sh(GPUCKPT, "import", str(archive), "--pod", target_pod, check=False, timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip() == (f"gpuckpt import: --pod {target_pod}: the container of {archive} was in no "
                                      "pod, and podman restores such a container only outside one: leave --pod out")
    assert set(staging_leftovers()) <= before
    assert sh("podman", "container", "exists", plain, check=False).returncode == 1, "restored all the same"


def test_a_container_or_pod_podman_lacks_exits_not_found(tmp_path: Path, member_archive: Path) -> None:
    missing = unique("nosuch")
    for argv in (["export", missing, "-o", str(tmp_path / "x.tar.zst")],
                 ["store", "checkpoint", missing, "--store", str(tmp_path / "store")]):
        result = sh(GPUCKPT, *argv, check=False, timeout=120)
        assert result.returncode == 4, (argv, result.stderr)  # was 5: podman's checkpoint failing
        assert result.stderr.strip() == f"gpuckpt {argv[0]}: no container {missing!r} in podman (podman ps -a " \
                                         "lists them)"
    assert not (tmp_path / "x.tar.zst").exists()
    result = sh(GPUCKPT, "import", str(member_archive), "--name", unique("x"), "--pod", missing, check=False,
                timeout=120)
    assert result.returncode == 4, result.stderr
    assert result.stderr.strip() == f"gpuckpt import: --pod {missing}: no such pod on this node (podman pod " \
                                    "create makes one)"
