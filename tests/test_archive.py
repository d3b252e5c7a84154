"""Checkpoint archives: round trip, hostile archives refused, and a fuzzed reader that never
writes outside its target nor fails with anything but a one-line ImageError."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuckpt.cli.main import main
from gpuckpt.errors import ImageError
from gpuckpt.oci.archive import read_archive, write_archive
from gpuckpt.oci.manifest import CudaProcessRecord, GpuRecord, Manifest, write_manifest


@pytest.fixture
def checkpoint_dir(tmp_path):
    source = tmp_path / "checkpoint"
    (source / "images").mkdir(parents=True)
    (source / "images" / "pages-1.img").write_bytes(os.urandom(1 << 20) + bytes(4 << 20))
    (source / "images" / "inventory.img").write_bytes(b"inventory")
    (source / "gpuckpt-manifest.json").write_text('{"schema_version": 1}')
    return source


def test_round_trip_is_exact_and_root_only(checkpoint_dir, tmp_path) -> None:
    archive = tmp_path / "c.tar.zst"
    size = write_archive(str(checkpoint_dir), str(archive), threads=2)
    assert size < 2 << 20  # the zero pages cost next to nothing
    assert oct(archive.stat().st_mode & 0o777) == "0o600"
    target = tmp_path / "out"
    entries = read_archive(str(archive), str(target))
    assert {e.name for e in entries} >= {"images/pages-1.img", "gpuckpt-manifest.json"}
    for path in checkpoint_dir.rglob("*"):
        if path.is_file():
            assert (target / path.relative_to(checkpoint_dir)).read_bytes() == path.read_bytes()
    assert oct(target.stat().st_mode & 0o777) == "0o700"


def hostile(tmp_path, build) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        build(tar)
    archive = tmp_path / "hostile.tar.zst"
    archive.write_bytes(zstandard.ZstdCompressor().compress(buffer.getvalue()))
    return str(archive)


def add_file(tar: tarfile.TarFile, name: str, data: bytes = b"x", **fields) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if info.isfile() else None)


@pytest.mark.parametrize("build, message", [
    (lambda t: add_file(t, "../evil"), "escapes the target"),
    (lambda t: add_file(t, "/etc/evil"), "escapes the target"),
    (lambda t: add_file(t, "a/../../evil"), "escapes the target"),
    (lambda t: add_file(t, "link", b"", type=tarfile.SYMTYPE, linkname="/etc/shadow"), "is a link"),
    (lambda t: add_file(t, "hard", b"", type=tarfile.LNKTYPE, linkname="../../etc/shadow"), "is a link"),
    (lambda t: add_file(t, "dev", b"", type=tarfile.CHRTYPE, devmajor=1, devminor=3), "device, FIFO"),
    (lambda t: (add_file(t, "same"), add_file(t, "same")), "appears twice"),
])
def test_hostile_entries_are_refused_and_nothing_stays(tmp_path, build, message) -> None:
    archive = hostile(tmp_path, build)
    target = tmp_path / "out"
    with pytest.raises(ImageError, match=message):
        read_archive(archive, str(target))
    assert not target.exists()
    assert not (tmp_path / "evil").exists()


def test_truncated_and_corrupt_streams_are_refused(checkpoint_dir, tmp_path) -> None:
    archive = tmp_path / "c.tar.zst"
    write_archive(str(checkpoint_dir), str(archive))
    data = archive.read_bytes()
    (tmp_path / "short.tar.zst").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match="truncated or corrupt"):
        read_archive(str(tmp_path / "short.tar.zst"), str(tmp_path / "o1"))
    (tmp_path / "plain.tar").write_bytes(b"not zstd at all")
    with pytest.raises(ImageError, match="truncated or corrupt"):
        read_archive(str(tmp_path / "plain.tar"), str(tmp_path / "o2"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(0, 1), garbage=st.binary(min_size=1, max_size=64), cut=st.booleans())
def test_fuzzed_archives_fail_cleanly_inside_the_target(tmp_path_factory, position, garbage, cut) -> None:
    base = tmp_path_factory.mktemp("fuzz")
    source = base / "src"
    (source / "d").mkdir(parents=True)
    (source / "d" / "f").write_bytes(bytes(range(256)) * 64)
    archive = base / "a.tar.zst"
    write_archive(str(source), str(archive), threads=1)
    data = bytearray(archive.read_bytes())
    at = int(position * (len(data) - 1))
    mutated = bytes(data[:at]) if cut else bytes(data[:at] + garbage + data[at + len(garbage):])
    archive.write_bytes(mutated)
    before = set(base.iterdir())
    try:
        entries = read_archive(str(archive), str(base / "out"))
        for entry in entries:
            assert (base / "out" / entry.name).resolve().is_relative_to((base / "out").resolve())
    except ImageError as error:
        assert "\n" not in str(error)
        assert not (base / "out").exists()
    assert set(base.iterdir()) - before <= {base / "out"}


def test_inspect_reads_the_manifest_from_a_directory_and_an_archive(tmp_path, capsys, node) -> None:
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "pages-1.img").write_bytes(bytes(1 << 20))
    write_manifest(str(source), Manifest(
        created="2026-11-22T00:00:00Z", container_id="ctr1", driver_version="580.159.04",
        gpus=[GpuRecord(index=0, uuid="GPU-11111111-2222-3333-4444-555555555555", name="NVIDIA H100", memory_total_bytes=80 << 30)],
        processes=[CudaProcessRecord(host_pid=42, container_pid=1, checkpointed_bytes=2 << 30, gpu_uuids=["GPU-11111111-2222-3333-4444-555555555555"])]))
    archive = tmp_path / "ckpt.tar.zst"
    write_archive(str(source), str(archive))
    for path in (source, archive):
        assert main(["inspect", str(path)]) == 0
        text = capsys.readouterr().out
        assert "container   ctr1" in text and "CUDA pid    42 (in container 1): 2.00 GiB on GPU-11111111-2222-3333-4444-555555555555" in text
        assert main(["inspect", "--json", str(path)]) == 0
        assert json.loads(capsys.readouterr().out)["manifest"]["processes"][0]["host_pid"] == 42


def test_inspect_refuses_an_unknown_manifest_version(tmp_path, capsys, node) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "gpuckpt-manifest.json").write_text('{"schema_version": 99}')
    assert main(["inspect", str(tmp_path / "ckpt")]) == 1
    assert "schema_version 99 is not supported" in capsys.readouterr().err
