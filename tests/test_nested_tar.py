"""What podman would unpack into a restored container's root (rootfs-diff.tar, volumes, /dev/shm,
deleted.files): checked entry by entry as the archive streams past, and applied by the shim inside
the root only (host/rooted.py), never through a link out of it."""

from __future__ import annotations

import io
import json
import os
import tarfile
import uuid
from pathlib import Path

import pytest
import zstandard
from podman_tars import podman_tar

from gpuckpt.errors import ImageError
from gpuckpt.oci.nested_tar import NestedTarCheck, parse_deleted_files
from gpuckpt.oci.podman_archive import NestedChecks, copy_checked, with_runtime
from gpuckpt.transfer.root_files import apply_root_files

Entry = tuple[str, str, object]  # name, kind, data or link target


def nested_tar(entries: list[Entry], *, mode: int = 0o644, pax: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, value in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 1_700_000_000
            data = None
            if kind == "file":
                payload = value if isinstance(value, bytes) else b""
                info.size, data = len(payload), io.BytesIO(payload)
                info.pax_headers = dict(pax or {})
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, str(value)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, str(value)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            elif kind == "char":
                info.type, (info.devmajor, info.devminor) = tarfile.CHRTYPE, value  # type: ignore[misc]
            tar.addfile(info, data)
    return out.getvalue()


LEGIT = [("etc", "dir", None), ("etc/app.conf", "file", b"port=80\n"), ("usr/local/bin/python", "symlink",
         "/usr/bin/python3"), ("data/a", "file", b"a" * 5000), ("data/b", "hardlink", "data/a"),
         ("run/queue", "fifo", None), ("lib/rel", "symlink", "../usr/lib")]


def checked(data: bytes, chunk: int = 0, allow_setuid: bool = False) -> None:
    check = NestedTarCheck("a.tar: rootfs-diff.tar", allow_setuid)
    step = chunk or len(data) or 1
    for at in range(0, len(data), step):
        check.write(data[at:at + step])
    check.finish()


@pytest.mark.parametrize("chunk", [0, 1, 7, 512, 4096])
def test_what_a_container_changes_passes_in_any_chunking(chunk) -> None:
    checked(nested_tar(LEGIT), chunk)


HOSTILE: list[tuple[str, list[Entry], str]] = [
    ("a link the tar makes, then a file written through it",
     [("evil", "symlink", "/etc"), ("evil/cron.d/x", "file", b"* * * * * root sh\n")], "written through the link"),
    ("a hard link to a host file", [("shadow", "hardlink", "etc/shadow")], "not a file made earlier"),
    ("a name with '..'", [("../../../../var/tmp/x", "file", b"x")], "'..' in its name"),
    ("an absolute name", [("/var/tmp/x", "file", b"x")], "absolute name"),
    ("a device node of the host's /dev/kmsg", [("dev/kmsg", "char", (1, 11))], r"device node \(c 1:11\)"),
    ("a relative link leaving the root", [("up", "symlink", "../../../../etc")], "leaving the container's root"),
    ("an overlay whiteout", [("etc/.wh.passwd", "file", b"")], "whiteout"),
]


@pytest.mark.hostile("archive whose rootfs-diff.tar has a link then a file through it, a hard link out, '..', an "
                     "absolute name, a device node, a link leaving the root or a whiteout")
@pytest.mark.parametrize(("case", "entries", "reason"), HOSTILE, ids=[case for case, _, _ in HOSTILE])
def test_a_hostile_diff_is_refused_naming_the_entry(case, entries, reason) -> None:
    with pytest.raises(ImageError, match=reason) as refused:
        checked(nested_tar(entries))
    assert "rootfs-diff.tar: entry" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.hostile("archive whose rootfs-diff.tar holds a setuid file or one with file capabilities")
@pytest.mark.parametrize("pax", [{}, {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}])
def test_setuid_and_capabilities_only_where_the_operator_allows(pax) -> None:
    data = nested_tar([("usr/bin/su2", "file", b"\x7fELF")], mode=0o4755 if not pax else 0o755, pax=pax)
    with pytest.raises(ImageError, match="import.allow_setuid_files"):
        checked(data)
    checked(data, allow_setuid=True)


def test_host_xattrs_are_refused() -> None:
    with pytest.raises(ImageError, match="trusted.overlay"):
        checked(nested_tar([("f", "file", b"x")], pax={"SCHILY.xattr.trusted.overlay.opaque": "y"}))


@pytest.mark.hostile("archive whose rootfs-diff.tar is a 2 GiB zstd stream of zeros (nested compression)")
def test_a_compressed_nested_tar_is_refused_at_its_first_bytes() -> None:
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))  # the same shape, smaller
    with pytest.raises(ImageError, match=r"is compressed \(zstd\)"):
        checked(bomb, 4096)


def test_a_truncated_nested_tar_is_refused() -> None:
    data = nested_tar([("f", "file", b"x" * 3000)])
    with pytest.raises(ImageError, match="truncated"):
        checked(data[:1024])


@pytest.mark.hostile("archive whose deleted.files names /../../../../var/tmp/x")
@pytest.mark.parametrize("path", ["/../../../../var/tmp/x", "../etc/passwd", "/", "a/\0b"])
def test_deleted_files_stay_inside_the_root(path) -> None:
    with pytest.raises(ImageError, match="not a file inside the container's root"):
        parse_deleted_files(json.dumps(["/tmp/ok", path]).encode(), "a.tar: deleted.files")
    assert parse_deleted_files(b'["/tmp/a", "var//log/./b"]', "x") == ["tmp/a", "var/log/b"]


def test_the_import_checks_nested_tars_and_deleted_files_in_the_archive() -> None:
    bad_diff = nested_tar(HOSTILE[0][1])
    with pytest.raises(ImageError, match="written through the link"):
        copy_checked(io.BytesIO(podman_tar([("rootfs-diff.tar", bad_diff)])), None, "a.tar", nested=NestedChecks())
    with pytest.raises(ImageError, match="volumes/data.tar: entry 'dev/kmsg'"):
        copy_checked(io.BytesIO(podman_tar([("volumes/data.tar", nested_tar(HOSTILE[4][1]))])), None, "a.tar",
                     nested=NestedChecks())
    with pytest.raises(ImageError, match="deleted.files"):
        copy_checked(io.BytesIO(podman_tar([("deleted.files", b'["/../../x"]')])), None, "a.tar",
                     nested=NestedChecks())
    copied = copy_checked(io.BytesIO(podman_tar([("rootfs-diff.tar", bad_diff)])), None, "a.tar")
    assert "rootfs-diff.tar" in copied.names  # export reads podman's own output: not checked there


def test_podman_gets_config_dump_naming_the_shim() -> None:
    out = io.BytesIO()
    copy_checked(io.BytesIO(podman_tar()), out, "a.tar", kept={},
                 rewrite={"config.dump": lambda data: with_runtime(data, "gpuckpt-runtime")})
    config_runc = json.dumps({"id": "c" * 64, "name": "x", "runtime": "runc", "lockID": 3}).encode()
    out = io.BytesIO()
    kept: dict[str, bytes] = {}
    copy_checked(io.BytesIO(podman_tar(config=config_runc)), out, "a.tar", kept=kept,
                 rewrite={"config.dump": lambda data: with_runtime(data, "gpuckpt-runtime")})
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        given = json.loads(tar.extractfile("config.dump").read())
    assert given == {"id": "c" * 64, "name": "x", "runtime": "gpuckpt-runtime", "lockID": 3, "mounts": []}
    assert json.loads(kept["config.dump"])["runtime"] == "runc"  # checked as the archive has it


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A container root as an image gives it: Debian's absolute /var/run -> /run link, /run a directory."""
    if os.geteuid() != 0:
        pytest.skip("applies files with their owners as root does (the shim runs as root)")
    root = tmp_path / "rootfs"
    (root / "var").mkdir(parents=True)
    (root / "run").mkdir()
    (root / "var" / "run").symlink_to("/run")
    return root


def apply(root: Path, tmp_path: Path, entries: list[Entry] | None = None, deleted: list[str] | None = None,
          allow_setuid: bool = False) -> tuple[int, int]:
    diff = deleted_path = None
    if entries is not None:
        diff = tmp_path / "rootfs-diff.tar"
        diff.write_bytes(nested_tar(entries))
    if deleted is not None:
        deleted_path = tmp_path / "deleted.files"
        deleted_path.write_text(json.dumps(deleted))
    return apply_root_files(str(root), str(diff) if diff else None, str(deleted_path) if deleted_path else None,
                            allow_setuid=allow_setuid, what="restore of c1")


def test_the_diff_is_applied_as_the_container_sees_its_root(root, tmp_path) -> None:
    applied, _ = apply(root, tmp_path, LEGIT)
    assert applied == len(LEGIT)
    assert (root / "etc/app.conf").read_bytes() == b"port=80\n"
    assert os.readlink(root / "usr/local/bin/python") == "/usr/bin/python3"
    assert os.stat(root / "data/a").st_ino == os.stat(root / "data/b").st_ino
    assert (root / "run/queue").is_fifo() and oct(os.stat(root / "etc/app.conf").st_mode & 0o777) == "0o644"


@pytest.mark.hostile("archive whose rootfs-diff.tar writes var/run/NAME and deleted.files removes var/run/NAME, "
                     "var/run being the image's own link to /run (podman 4.3 follows it to the host's /run)")
def test_the_images_own_absolute_links_resolve_inside_the_root(root, tmp_path) -> None:
    name = f"gpuckpt-test-{uuid.uuid4().hex}"
    host_victim = Path("/run") / f"{name}-victim"
    host_victim.write_text("the host's")
    try:
        apply(root, tmp_path, [(f"var/run/{name}", "file", b"through the image's link")],
              deleted=[f"/var/run/{name}-victim"])
        assert (root / "run" / name).read_bytes() == b"through the image's link"
        assert not (Path("/run") / name).exists()
        assert host_victim.read_text() == "the host's"
    finally:
        host_victim.unlink()
        (Path("/run") / name).unlink(missing_ok=True)


def test_deletions_remove_inside_the_root_and_never_follow_links(root, tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (root / "old").mkdir()
    (root / "old" / "f").write_text("y")
    (root / "old" / "out").symlink_to(outside)
    (root / "linkdir").symlink_to(outside)
    _, removed = apply(root, tmp_path, deleted=["/old", "/linkdir", "/linkdir/keep", "/missing/x"])
    assert removed == 2 and not (root / "old").exists() and not (root / "linkdir").exists()
    assert (outside / "keep").read_text() == "x"


def test_the_shim_refuses_what_the_import_would_have(root, tmp_path) -> None:
    with pytest.raises(ImageError, match="written through the link"):
        apply(root, tmp_path, HOSTILE[0][1])
    assert not os.path.lexists(root / "evil")  # checked whole before anything is made


@pytest.mark.hostile("archive whose volume tar makes a directory and a file in it, replaces the directory by a link "
                     "to a host directory, then hard-links the file (podman 4.3 linked and chowned the host file)")
def test_a_directory_replaced_after_its_files_is_refused() -> None:
    with pytest.raises(ImageError, match="replaces a directory the tar made earlier"):
        checked(nested_tar([("a", "dir", None), ("a/shadow", "file", b"x"), ("a", "symlink", "/etc"),
                            ("x", "hardlink", "a/shadow")]))


def _symlink_block(name: str, target: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


def _extension(kind: bytes, payload: bytes) -> bytes:
    info = tarfile.TarInfo("././@Ext")
    info.type, info.size = kind, len(payload)
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict") + payload + bytes(-len(payload) % 512)


def _file_block(name: str, data: bytes, magic: bool = True) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")[:512])
    if not magic:  # a V7 header with a prefix: tarfile reads "zzz/NAME", Go's archive/tar "NAME"
        block[257:265], block[345:500] = bytes(8), b"zzz".ljust(155, b"\0")
        block[148:156] = b"        "
        block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block) + data + bytes(-len(data) % 512)


@pytest.mark.hostile("nested tar entries that Python's tarfile and Go's archive/tar (podman) name differently: a PAX "
                     "path with a GNU long name, a PAX global header, a V7 header with a prefix")
@pytest.mark.parametrize(("body", "reason"), [
    (_extension(tarfile.XHDTYPE, b"17 path=safe/xyz\n") + _extension(tarfile.GNUTYPE_LONGNAME, b"a/planted\0")
     + _file_block("safe", b"x"), "both a PAX record and a GNU long name"),
    (_extension(tarfile.XGLTYPE, b"15 comment=xyz\n") + _file_block("safe", b"x"), "a PAX global header"),
    (_file_block("a/planted", b"x", magic=False), "without ustar's magic"),
], ids=["pax-and-gnu-name", "global-header", "v7-prefix"])
def test_entries_two_readers_name_differently_are_refused(body, reason) -> None:
    data = _symlink_block("a", "/var/tmp") + body + bytes(1024)
    with pytest.raises(ImageError, match=reason):
        checked(data)


@pytest.mark.hostile("nested tars from the desk review: a hard link through a parent the tar never named, then made "
                     "a link; a 10,000-deep path; a negative PAX size; a uid of 2^32-1; no end-of-archive blocks")
def test_the_desk_reviews_cases_are_refused_at_the_import() -> None:
    with pytest.raises(ImageError, match="replaces a directory the tar made earlier"):
        checked(nested_tar([("a/su", "file", b"x"), ("a", "symlink", "/usr/bin"), ("x", "hardlink", "a/su")]))
    with pytest.raises(ImageError, match="deeper than 128 directories"):
        checked(nested_tar([("/".join(["d"] * 10_000) + "/f", "file", b"x")]))
    with pytest.raises(ImageError, match="declares -1024 bytes"):
        checked(nested_tar([("f", "file", b"x")], pax={"size": "-1024"}))
    info = tarfile.TarInfo("f")
    info.uid = 2**32 - 1
    owned = io.BytesIO()
    with tarfile.open(fileobj=owned, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ImageError, match="is owned by uid 4294967295"):
        checked(owned.getvalue())
    with pytest.raises(ImageError, match="no end-of-archive blocks"):
        checked(nested_tar([("f", "file", b"x" * 512)])[:1024])


def test_a_diff_of_more_entries_than_an_archive_has_is_applied_whole(root, tmp_path) -> None:
    """The shim reads a diff with the import's bound on entries (a framework install: ~100k files), not
    the outer archive's 50,000."""
    entries: list[Entry] = [(f"many/{index}", "file", b"") for index in range(50_100)]
    applied, _ = apply(root, tmp_path, entries)
    assert applied == 50_100 and len(os.listdir(root / "many")) == 50_100


def test_volume_and_shm_content_goes_only_into_podmans_own_directories(tmp_path) -> None:
    """The mounts come from spec.dump: the shim writes a volume's tar only into the directory this node's
    podman made for that volume, and /dev/shm's only into a container's shm directory under its storage."""
    from gpuckpt.oci.spec import Spec
    from gpuckpt.transfer.root_files import apply_staged
    from gpuckpt.transfer.staging import ClaimedImport

    storage = str(tmp_path / "storage")
    volume_dir = tmp_path / "storage" / "volumes" / "data" / "_data"
    volume_dir.mkdir(parents=True)
    victim = tmp_path / "etc"
    victim.mkdir()
    tar = tmp_path / "data.tar"
    tar.write_bytes(nested_tar([("kept", "file", b"volume data")]))

    def staged(source: str, entry: str = "volumes/data.tar", destination: str = "/data") -> ClaimedImport:
        spec = Spec.model_validate({"mounts": [{"destination": destination, "type": "bind", "source": source,
                                                "options": ["rbind"]}]})
        claimed = ClaimedImport([], {entry: str(tar)}, {"data": "/data"}, {"data": str(volume_dir)}, storage)
        apply_staged(spec, "/bundle", claimed, "restore of c1")
        return claimed

    with pytest.raises(ImageError, match="not the volume's directory"):
        staged(str(victim))
    assert list(victim.iterdir()) == []
    with pytest.raises(ImageError, match="not a directory podman makes under"):
        staged(str(victim), "devshm-checkpoint.tar", "/dev/shm")
    if os.geteuid() == 0:
        staged(str(volume_dir))
        assert (volume_dir / "kept").read_bytes() == b"volume data"
