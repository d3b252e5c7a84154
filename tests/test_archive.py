"""Archives as every reader of them sees them (import, inspect, trust verify: `scan_archive`):
hostile entries and broken streams refused with one line, and a fuzzed stream that fails with
nothing but a one-line ImageError."""

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
from gpuckpt.oci.manifest import CudaProcessRecord, GpuRecord, Manifest, write_manifest
from gpuckpt.oci.podman_archive import scan_archive


def tar_zst(path, build) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        build(tar)
    path.write_bytes(zstandard.ZstdCompressor().compress(buffer.getvalue()))
    return str(path)


def hostile(tmp_path, build) -> str:
    return tar_zst(tmp_path / "hostile.tar.zst", build)


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
    before = set(tmp_path.iterdir())
    with pytest.raises(ImageError, match=message) as refused:
        scan_archive(archive)
    assert "\n" not in str(refused.value)
    assert set(tmp_path.iterdir()) == before and not (tmp_path.parent / "evil").exists()


def test_truncated_and_corrupt_streams_are_refused(tmp_path) -> None:
    archive = tar_zst(tmp_path / "c.tar.zst", lambda t: add_file(t, "pages-1.img", os.urandom(1 << 20)))
    data = open(archive, "rb").read()
    (tmp_path / "short.tar.zst").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match="truncated or corrupt"):
        scan_archive(str(tmp_path / "short.tar.zst"))
    (tmp_path / "plain.tar").write_bytes(b"not zstd at all")
    with pytest.raises(ImageError, match="truncated or corrupt"):
        scan_archive(str(tmp_path / "plain.tar"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(0, 1), garbage=st.binary(min_size=1, max_size=64), cut=st.booleans())
def test_fuzzed_archives_fail_with_one_line(tmp_path_factory, position, garbage, cut) -> None:
    base = tmp_path_factory.mktemp("fuzz")
    archive = base / "a.tar.zst"
    tar_zst(
        archive, lambda t: (add_file(t, "d", b"", type=tarfile.DIRTYPE), add_file(t, "d/f", bytes(range(256)) * 64))
    )
    data = bytearray(archive.read_bytes())
    at = int(position * (len(data) - 1))
    mutated = bytes(data[:at]) if cut else bytes(data[:at] + garbage + data[at + len(garbage):])
    archive.write_bytes(mutated)
    before = set(base.iterdir())
    try:
        copied, _ = scan_archive(str(archive))
        assert all(not name.startswith(("/", "..")) for name in copied.names)
    except ImageError as error:
        assert "\n" not in str(error)
    assert set(base.iterdir()) == before


def test_inspect_reads_the_manifest_from_a_directory(tmp_path, capsys, node) -> None:
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "pages-1.img").write_bytes(bytes(1 << 20))
    write_manifest(
        str(source),
        Manifest(
            created="2026-11-22T00:00:00Z",
            container_id="ctr1",
            driver_version="580.159.04",
            gpus=[
                GpuRecord(
                    index=0,
                    uuid="GPU-11111111-2222-3333-4444-555555555555",
                    name="NVIDIA H100",
                    memory_total_bytes=80 << 30,
                )
            ],
            processes=[
                CudaProcessRecord(
                    host_pid=42,
                    container_pid=1,
                    checkpointed_bytes=2 << 30,
                    gpu_uuids=["GPU-11111111-2222-3333-4444-555555555555"],
                )
            ],
        ),
    )
    assert main(["inspect", str(source)]) == 0
    text = capsys.readouterr().out
    assert "container   ctr1" in text
    assert "CUDA pid    42 (in container 1): 2.00 GiB on GPU-11111111-2222-3333-4444-555555555555" in text
    assert main(["inspect", "--json", str(source)]) == 0
    assert json.loads(capsys.readouterr().out)["manifest"]["processes"][0]["host_pid"] == 42


def test_inspect_refuses_an_archive_that_is_not_podmans(tmp_path, capsys, node) -> None:
    """The only archives written are podman's layout (podman, gpuckpt export): anything else is refused."""
    archive = tar_zst(tmp_path / "ckpt.tar.zst", lambda t: add_file(t, "gpuckpt-manifest.json", b'{"schema_version": '
                                                                                                b'1}'))
    assert main(["inspect", archive]) == 3  # refused (cli/exit_codes.py)
    assert "not a podman checkpoint archive" in capsys.readouterr().err


def test_inspect_refuses_an_unknown_manifest_version(tmp_path, capsys, node) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "gpuckpt-manifest.json").write_text('{"schema_version": 99}')
    assert main(["inspect", str(tmp_path / "ckpt")]) == 3
    assert "schema_version 99 is not supported" in capsys.readouterr().err
