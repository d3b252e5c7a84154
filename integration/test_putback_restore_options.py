"""podman's restore options through `gpuckpt import` and `gpuckpt store restore`, with real podman 4.3: what each
one that changes the restored container does, bad values refused in one line before anything runs, and a
name already taken refused before the archive is checked or anything staged.

One archive (a container on podman's bridge network that wrote /putback-marker into its root) is exported once
per module; nothing here sends traffic anywhere (the published port is only read back from podman's config).
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest
from bed import GPUCKPT, PODMAN_IMAGE, sh, staging_leftovers

pytestmark = pytest.mark.integration
_names = itertools.count()
MARKER_WRITER = "import time; open('/putback-marker', 'w').write('x'); time.sleep(100000)"
VOLUME_WRITER = "import time; open('/data/putback-in-volume', 'w').write('x'); time.sleep(100000)"


def new_name(what: str) -> str:
    return f"putback-{what}-{os.getpid()}-{next(_names)}"


def exported(tmp: Path, what: str, *run_flags: str, source: str = MARKER_WRITER) -> tuple[str, Path]:
    """A sleeping container's archive (gpuckpt export, signed by the node key); the container removed."""
    name, archive = new_name(what), tmp / f"{what}.tar.zst"
    sh("podman", "run", "-d", "--name", name, *run_flags, PODMAN_IMAGE, "python3", "-c", source)
    try:
        deadline = time.monotonic() + 30
        while sh("podman", "exec", name, "python3", "-c", "print(1)", check=False).returncode != 0:
            assert time.monotonic() < deadline, "the container did not start"
        time.sleep(0.5)  # its first line has run: the marker is written
        sh(GPUCKPT, "export", name, "-o", str(archive), timeout=300)
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
    return name, archive


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[str, Path]:
    return exported(tmp_path_factory.mktemp("putback-options"), "opts", "--network", "bridge")


@pytest.fixture
def restored():
    names: list[str] = []
    yield names
    for name in names:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


def gpuckpt_import(archive: Path, *flags: str, check: bool = True):
    return sh(GPUCKPT, "import", str(archive), *flags, check=check, timeout=300)


def has_marker(name: str) -> bool:
    return sh("podman", "exec", name, "test", "-e", "/putback-marker", check=False).returncode == 0


def test_ignore_rootfs_leaves_the_changed_files_out(archive, restored) -> None:
    _, path = archive
    plain, ignoring = new_name("plain"), new_name("norootfs")
    restored += [plain, ignoring]
    gpuckpt_import(path, "--name", plain)
    assert has_marker(plain), "without --ignore-rootfs the file the container wrote is back"
    gpuckpt_import(path, "--name", ignoring, "--ignore-rootfs")
    assert sh("podman", "inspect", "--format", "{{.State.Running}}", ignoring).stdout.strip() == "true"
    assert not has_marker(ignoring), "--ignore-rootfs: the staged diff was applied all the same"


def test_publish_reaches_podman_as_a_port_binding(archive, restored) -> None:
    _, path = archive
    name = new_name("published")
    restored.append(name)
    gpuckpt_import(path, "--name", name, "-p", "127.0.0.1:18481:80/tcp", "--publish", "18482:81")
    bindings = sh("podman", "inspect", "--format", "{{json .HostConfig.PortBindings}}", name).stdout
    assert '"80/tcp":[{"HostIp":"127.0.0.1","HostPort":"18481"}]' in bindings, bindings
    assert '"81/tcp":[{"HostIp":"","HostPort":"18482"}]' in bindings, bindings


@pytest.mark.parametrize("value", ["80:80 --privileged", "--privileged", "99999:80", "1.2.3.999:80:80",
                                   "8000-8010:80-81", "80/icmp", "80:80\n"])
def test_a_bad_publish_is_refused_in_one_line_before_anything(archive, value) -> None:
    _, path = archive
    before = set(staging_leftovers())
    result = gpuckpt_import(path, "--name", new_name("badpub"), f"--publish={value}", check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"gpuckpt import: --publish {value!r}: "), result.stderr
    assert "give [[IP:][HOST_PORT]:]CONTAINER_PORT" in result.stderr and len(result.stderr.splitlines()) == 1
    assert set(staging_leftovers()) <= before


def test_a_missing_pod_is_not_found_and_a_pod_for_an_archive_of_none_is_refused_first(archive, restored) -> None:
    _, path = archive
    pod, name = new_name("pod"), new_name("inpod")
    missing = gpuckpt_import(path, "--name", name, "--pod", pod, check=False)
    assert missing.returncode == 4  # not found (cli/exit_codes.py)
    assert missing.stderr.strip() == f"gpuckpt import: --pod {pod}: no such pod on this node (podman pod create " \
                                     "makes one)"
    sh("podman", "pod", "create", "--infra=false", "--name", pod)
    try:
        restored.append(name)
        # the archive's container was in no pod: podman refuses it only after staging, gpuckpt before (a pod's
        # member restored into a pod by name: integration/test_pod_members.py)
        refused = gpuckpt_import(path, "--name", name, "--pod", pod, check=False)
        assert refused.returncode == 2 and "was in no pod" in refused.stderr, refused.stderr
    finally:
        sh("podman", "pod", "rm", "-f", pod, check=False)


def test_ignore_volumes_leaves_the_volume_content_out(tmp_path, restored) -> None:
    volume = new_name("vol")
    sh("podman", "volume", "create", volume)
    try:
        _, path = exported(tmp_path, "vol", "--network", "none", "-v", f"{volume}:/data", source=VOLUME_WRITER)
    finally:
        sh("podman", "volume", "rm", "-f", volume, check=False)  # an import refuses a volume already here
    for flags, kept in (([], True), (["--ignore-volumes"], False)):
        name = new_name("vol")
        restored.append(name)
        gpuckpt_import(path, "--name", name, *flags)
        found = sh("podman", "exec", name, "test", "-e", "/data/putback-in-volume", check=False).returncode == 0
        assert found is kept, f"{flags}: the volume's file is {'missing' if kept else 'there'}"
        sh("podman", "rm", "-f", "-t", "0", name)
        sh("podman", "volume", "rm", "-f", volume, check=False)


def test_keep_and_static_address_flags_pass_through(archive, restored) -> None:
    _, path = archive
    name = new_name("kept")
    restored.append(name)
    gpuckpt_import(path, "--name", name, "--keep", "--ignore-static-ip", "--ignore-static-mac")
    userdata = Path(sh("podman", "inspect", "--format", "{{.StaticDir}}", name).stdout.strip())
    assert any(userdata.glob("checkpoint/*.img")), "--keep: podman kept no checkpoint files"


def startup_s() -> float:
    started = time.monotonic()
    sh(GPUCKPT, "import", "--help")  # every module of the CLI loaded, nothing read
    return time.monotonic() - started


def test_a_name_taken_is_refused_before_the_archive_is_read(archive, restored, tmp_path) -> None:
    _, path = archive
    taken = new_name("taken")
    sh("podman", "create", "--name", taken, "--network", "none", PODMAN_IMAGE, "true")
    restored.append(taken)
    before, baseline = set(staging_leftovers()), startup_s()
    started = time.monotonic()
    result = gpuckpt_import(path, "--name", taken, check=False)
    elapsed = time.monotonic() - started
    assert result.returncode == 2
    assert result.stderr.strip() == f"gpuckpt import: a container with the name {taken} already exists on this " \
                                    "node: refused (give --name NEW, or remove it first)"
    assert elapsed < baseline + 1.0, f"{elapsed:.1f} s, {baseline:.1f} s to start: it was not refused at once"
    assert set(staging_leftovers()) <= before
    # the same before any chunk of a stored checkpoint is read
    stored = tmp_path / "store"
    source = new_name("src")
    sh("podman", "run", "-d", "--name", source, "--network", "none", PODMAN_IMAGE, "sleep", "1000")
    restored.append(source)
    sh(GPUCKPT, "store", "checkpoint", "--leave-running", source, "--name", "one", "--store", str(stored),
       timeout=300)
    refused = sh(GPUCKPT, "store", "restore", "one", "--name", taken, "--store", str(stored), check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"gpuckpt store: a container with the name {taken} already exists on this " \
                                     "node: refused (give --name NEW, or remove it first)"


def test_without_name_the_archives_own_name_taken_is_refused_before_staging(archive, restored) -> None:
    original, path = archive
    sh("podman", "create", "--name", original, "--network", "none", PODMAN_IMAGE, "true")
    restored.append(original)
    before, baseline = set(staging_leftovers()), startup_s()
    started = time.monotonic()
    result = gpuckpt_import(path, check=False)
    elapsed = time.monotonic() - started
    assert result.returncode == 2
    assert result.stderr.strip() == f"gpuckpt import: a container with the name {original} already exists on " \
                                    "this node: refused (give --name NEW, or remove it first)"
    # from config.dump at the archive's head, before podman's `info` (the trial of 2026-11-28b: 2.4 s)
    assert elapsed < baseline + 1.0, f"{elapsed:.1f} s, {baseline:.1f} s to start: it was not refused at once"
    assert set(staging_leftovers()) <= before


def test_the_store_restore_passes_the_same_options(tmp_path, restored) -> None:
    """--ignore-rootfs and --publish through `gpuckpt store restore`: the store's own restore path."""
    source, stored = new_name("storesrc"), tmp_path / "store"
    sh("podman", "run", "-d", "--name", source, "--network", "bridge", PODMAN_IMAGE, "python3", "-c", MARKER_WRITER)
    restored.append(source)
    deadline = time.monotonic() + 30
    while not has_marker(source):
        assert time.monotonic() < deadline, "the container wrote no marker"
        time.sleep(0.2)
    sh(GPUCKPT, "store", "checkpoint", "--leave-running", source, "--name", "one", "--store", str(stored),
       timeout=300)
    name = new_name("fromstore")
    restored.append(name)
    sh(GPUCKPT, "store", "restore", "one", "--name", name, "--ignore-rootfs", "-p", "127.0.0.1:18483:80",
       "--store", str(stored), timeout=300)
    assert not has_marker(name), "--ignore-rootfs: the stored diff was applied all the same"
    bindings = sh("podman", "inspect", "--format", "{{json .HostConfig.PortBindings}}", name).stdout
    assert '"80/tcp":[{"HostIp":"127.0.0.1","HostPort":"18483"}]' in bindings, bindings
    bad = sh(GPUCKPT, "store", "restore", "one", "--name", new_name("bad"), "-p", "80:80 -v /:/host",
             "--store", str(stored), check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("gpuckpt store: --publish '80:80 -v /:/host': ")
