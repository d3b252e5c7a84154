"""Checkpoint archives between gpuckpt and the ecosystem's own tools, with real podman and checkpointctl.

podman restores (`restore --import`) what `gpuckpt export` writes, checkpointctl reads it,
`gpuckpt import` restores what podman's `checkpoint --export` writes, and a hostile archive
is refused before podman sees a byte of it.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import stat
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard
from bed import (
    COUNTER_SOURCE,
    GPUCKPT,
    PODMAN_IMAGE,
    assert_continues,
    sh,
    staging_leftovers,
    unsigned_allowed_on_node,
    wait_counter,
)
from podman_tars import SPEC as PODMAN_SPEC

_names = itertools.count()


def start_counter(runtime_flags: list[str]) -> str:
    name = f"gpuckpt-arc-{os.getpid()}-{next(_names)}"
    sh("podman", "run", "-d", "--name", name, "--network", "none", *runtime_flags, PODMAN_IMAGE,
       "python3", "-c", COUNTER_SOURCE)
    return name


@pytest.fixture
def counter_container(runc_delegate):
    name = start_counter([])  # podman's default runtime: gpuckpt-runtime
    yield name
    sh("podman", "rm", "-f", "-t", "0", name, check=False)


@pytest.fixture
def unsigned_allowed(tmp_path):
    """podman's own archives and hand-made ones are unsigned: this test's directory is an explicit
    exception in the trust policy while it runs (gpuckpt import refuses them otherwise)."""
    source = f"archive:{tmp_path}/"
    with unsigned_allowed_on_node(source, note="integration test"):
        yield source




def read_state(name: str):
    return lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout


def test_podman_restores_our_archive_and_checkpointctl_reads_it(counter_container, tmp_path) -> None:
    name, archive = counter_container, tmp_path / "ours.tar.zst"
    before = wait_counter(read_state(name), minimum=3)
    exported = sh(GPUCKPT, "export", name, "-o", str(archive))
    assert "exported" in exported.stdout and exported.stderr == ""  # no progress when not on a terminal
    assert exported.stdout.rstrip().endswith(f"; {name} is stopped (`podman container restore {name}` runs it again "
                                             "here)"), exported.stdout  # the operator is told it stopped
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600  # process memory: root only
    assert "Exited" in sh("podman", "ps", "-a", "--filter", f"name={name}", "--format", "{{.Status}}").stdout
    shown = sh("checkpointctl", "show", str(archive)).stdout
    assert name in shown and "Podman" in shown and "gpuckpt-runtime" in shown
    inspected = sh("checkpointctl", "inspect", "--all", str(archive)).stdout
    assert name in inspected and "CRIU dump statistics" in inspected and "Process tree" in inspected
    summary = json.loads(sh(GPUCKPT, "inspect", "--json", str(archive)).stdout)
    assert summary["container"]["name"] == name and summary["engine"] == "podman"
    # the shim's manifest travelled inside
    assert summary["manifest"]["container_id"] == sh("podman", "inspect", "--format", "{{.Id}}", name).stdout.strip()
    sh("podman", "rm", "-f", name)
    sh("podman", "container", "restore", "--import", str(archive))
    assert_continues(before, read_state(name))


@pytest.mark.parametrize("runtime", ["gpuckpt-runtime", "runc"])
def test_we_restore_podmans_archive(runc_delegate, tmp_path, unsigned_allowed, runtime) -> None:
    """The pages are staged beside podman's storage and renamed into place by the shim's restore; an
    archive of a runc container (its dump unsigned: plain runc made it) restores through the shim too,
    which takes the import's word for the archive it came in. runc by its path: podman's name "runc"
    is the shim on a node set up with `gpuckpt install --engine podman --default`."""
    name = start_counter(["--runtime", runtime if runtime == "gpuckpt-runtime" else shutil.which("runc") or "runc"])
    archive = tmp_path / "podmans.tar.zst"
    try:
        before = wait_counter(read_state(name), minimum=3)
        sh("podman", "container", "checkpoint", "--export", str(archive), name)  # podman's default: zstd
        sh("podman", "rm", "-f", name)
        imported = sh(GPUCKPT, "import", str(archive))
        assert f"restored {name}" in imported.stdout
        assert "staged" in imported.stdout
        assert ("replaced by gpuckpt-runtime" in imported.stdout) == (runtime == "runc"), imported.stdout
        assert sh("podman", "inspect", "--format", "{{.OCIRuntime}}", name).stdout.strip() == "gpuckpt-runtime"
        assert_continues(before, read_state(name))
        assert staging_leftovers() == []
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


def podman_made(name: str) -> bool:
    """Whether a container of this name (the one an archive's config.dump names) exists: other
    tests may make and remove containers meanwhile, so podman ps as a whole says nothing."""
    return sh("podman", "container", "exists", name, check=False).returncode == 0


def hostile_archive(path: Path, evil: tarfile.TarInfo, good_config: bool = True) -> None:
    """A podman-shaped archive (config.dump, spec.dump, checkpoint/inventory.img) plus one bad entry."""
    config = json.dumps({"id": "0" * 64, "name": "hostile"}).encode() if good_config else b"{not json"
    with open(path, "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as compressed, \
            tarfile.open(fileobj=compressed, mode="w|") as tar:
        for entry, data in (("config.dump", config), ("spec.dump", PODMAN_SPEC), ("checkpoint/inventory.img", b"x")):
            info = tarfile.TarInfo(entry)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.addfile(evil, io.BytesIO(b"owned\n") if evil.isfile() else None)


def evil_entry(kind: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo({"dotdot": "checkpoint/../../../tmp/gpuckpt-owned", "absolute": "/tmp/gpuckpt-owned",
                            "symlink": "checkpoint/link", "device": "checkpoint/mem"}[kind])
    if kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/shadow"
    elif kind == "device":
        info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 1
    else:
        info.size = 6
    return info


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink", "device"])
def test_hostile_archive_is_refused_before_podman_sees_it(tmp_path, unsigned_allowed, kind) -> None:
    archive = tmp_path / "hostile.tar.zst"
    hostile_archive(archive, evil_entry(kind))
    result = sh(GPUCKPT, "import", str(archive), check=False)
    assert result.returncode == 3
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and str(archive) in message, message
    assert evil_entry(kind).name.lstrip("/") in message or evil_entry(kind).name in message, message
    assert not os.path.lexists("/tmp/gpuckpt-owned")
    assert not podman_made("hostile")  # podman never ran
    assert staging_leftovers() == []


def test_corrupt_config_and_truncated_stream_are_refused(tmp_path, unsigned_allowed) -> None:
    bad_config = tmp_path / "config.tar.zst"
    info = tarfile.TarInfo("stats-dump")
    info.size = 6
    hostile_archive(bad_config, info, good_config=False)
    result = sh(GPUCKPT, "import", str(bad_config), check=False)
    assert result.returncode == 3 and "config.dump" in result.stderr, result.stderr
    truncated = tmp_path / "truncated.tar.zst"
    truncated.write_bytes(bad_config.read_bytes()[:-40])
    result = sh(GPUCKPT, "import", str(truncated), check=False)
    assert result.returncode == 3 and "truncated or corrupt" in result.stderr, result.stderr


def test_a_host_bind_mount_needs_trust_config(runc_delegate, tmp_path) -> None:
    """podman's own --import would mount whatever host path the archive names; gpuckpt asks first."""
    host_dir = tmp_path / "shared"
    host_dir.mkdir()
    name = start_counter(["-v", f"{host_dir}:/shared:ro"])
    archive = tmp_path / "mounts.tar.zst"
    try:
        before = wait_counter(read_state(name), minimum=3)
        sh(GPUCKPT, "export", name, "-o", str(archive))
        sh("podman", "rm", "-f", name)
        refused = sh(GPUCKPT, "import", str(archive), check=False)
        assert refused.returncode == 3 and f"host bind mounts in spec.dump ({host_dir})" in refused.stderr
        assert "--trust-config" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
        assert not podman_made(name) and staging_leftovers() == []
        sh(GPUCKPT, "import", "--trust-config", str(archive))
        assert_continues(before, read_state(name))
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


class _Zeros(io.RawIOBase):
    """`size` zero bytes, made as they are read (a 4 GiB entry never sits in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count

    def readable(self) -> bool:
        return True


def zero_pages_archive(path: Path, pages_first: bool) -> None:
    """The issue's archive: a podman-shaped archive whose pages-1.img is 4 GiB of zeros (about
    140 KB of zstd), with its pages before its config, or after a config that passes the checks
    and names gpuckpt-runtime (so that the pages would be staged)."""
    config = json.dumps({"id": "0" * 64, "name": f"zero-pages-{os.getpid()}", "runtime": "gpuckpt-runtime"}).encode()
    small = [("config.dump", config), ("spec.dump", PODMAN_SPEC)]
    image = [("checkpoint/inventory.img", b"x"), ("checkpoint/pages-1.img", 4 << 30)]
    with open(path, "wb") as raw, zstandard.ZstdCompressor(level=1, threads=2).stream_writer(raw) as compressed, \
            tarfile.open(fileobj=compressed, mode="w|") as tar:
        for entry, data in image + small if pages_first else small + image:
            info = tarfile.TarInfo(entry)
            info.size = data if isinstance(data, int) else len(data)
            tar.addfile(info, _Zeros(data) if isinstance(data, int) else io.BytesIO(data))


class StagingWatch:
    """What the staging directories beside podman's storage hold on disk while an import runs,
    polled every millisecond: the most bytes allocated at once, and every file name seen."""

    def __init__(self) -> None:
        self.most_bytes, self.names, self._stop = 0, set(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            held = 0
            for directory in Path("/var/lib/containers").glob(".gpuckpt-import-*"):
                try:
                    for file in directory.iterdir():
                        self.names.add(file.name)
                        held += file.lstat().st_blocks * 512
                except FileNotFoundError:
                    pass  # removed meanwhile
            self.most_bytes = max(self.most_bytes, held)
            self._stop.wait(0.001)

    def __enter__(self) -> "StagingWatch":
        self._thread.start()
        return self

    def __exit__(self, *failure) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.hostile("a 140 KB zstd archive whose pages-1.img is 4 GiB of zeros, before or after a passing config")
@pytest.mark.parametrize("pages_first", [True, False], ids=["pages-before-config", "config-first"])
def test_a_small_archive_of_zero_pages_stages_nothing(tmp_path, unsigned_allowed, pages_first) -> None:
    """The issue's attack: import reserved (fallocate) and wrote 4 GiB before the config was
    checked. Now the config comes first or the archive is refused, and a pages entry that could
    only come from an all-zero stream is refused at its header, before a byte is reserved."""
    archive = tmp_path / "zero-pages.tar.zst"
    zero_pages_archive(archive, pages_first)
    assert 100_000 < archive.stat().st_size < 200_000
    with StagingWatch() as watch:
        result = sh(GPUCKPT, "import", str(archive), check=False)
    message = result.stderr.strip()
    assert result.returncode == 3 and len(message.splitlines()) == 1 and f" {archive}: " in message, message
    if pages_first:
        assert "checkpoint/inventory.img comes before config.dump and spec.dump: refused" in message
        assert watch.most_bytes == 0 and not watch.names  # no staging directory was ever made
    else:
        assert ("checkpoint/pages-1.img declares 4096 MiB, which would expand more than 4096 times its compressed "
                "size: refused (import.max_entry_ratio") in message
        assert "pages-1.img" not in watch.names and watch.most_bytes < 1 << 20  # the small entries before it only
    assert not podman_made(f"zero-pages-{os.getpid()}")  # podman never ran
    assert staging_leftovers() == []


@pytest.mark.hostile("a real podman archive larger than the operator's import.max_staged_bytes")
def test_an_import_past_the_staging_cap_is_refused_and_leaves_nothing(runc_delegate, tmp_path,
                                                                      unsigned_allowed) -> None:
    """Refused mid-staging (the pages declare more than the cap): no staging directory, no partial
    file, no record, no container; the same archive imports once the operator raises the cap."""
    name = start_counter([])
    archive = tmp_path / "podmans.tar.zst"
    try:
        before = wait_counter(read_state(name), minimum=3)
        sh("podman", "container", "checkpoint", "--export", str(archive), name)
        sh("podman", "rm", "-f", name)
        capped = tmp_path / "node" / "config.toml"  # this import's own: tests beside it rewrite the node's
        capped.parent.mkdir()
        capped.write_text('delegate = "runc"\n[import]\nmax_staged_bytes = 8388608\n')
        with StagingWatch() as watch:
            refused = sh(GPUCKPT, "import", str(archive), check=False, env=dict(os.environ, GPUCKPT_CONFIG=str(capped)))
        message = refused.stderr.strip()
        assert refused.returncode == 3 and len(message.splitlines()) == 1, message
        assert f"{archive}: checkpoint/pages-1.img needs " in message, message
        assert "MiB of staging, more than this import may still stage" in message, message
        assert "import.max_staged_bytes 8 MiB" in message, message
        assert "pages-1.img" not in watch.names and watch.most_bytes <= 8 << 20
        assert not podman_made(name)  # podman never ran
        assert staging_leftovers() == []
        assert sorted(p.name for p in tmp_path.iterdir()) == ["node", "podmans.tar.zst"]
        sh(GPUCKPT, "import", str(archive))  # under the node's config: the default bounds
        assert_continues(before, read_state(name))
        assert staging_leftovers() == []
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
