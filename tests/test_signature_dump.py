"""The shim's dump signature over a CRIU image directory: made at dump, checked at restore; a
file added, changed, resized or removed, an unsigned or untrusted directory refused with one line."""

from __future__ import annotations

import json
import os
import socket

import pytest

from gpuckpt.trust.dump_signature import DUMP_SIGNATURE, sign_dump, verify_dump
from gpuckpt.trust.keys import TrustPolicy, UnsignedSource, load_trust, save_policy
from gpuckpt.trust.signature import SignatureError

WHAT = "restore of ctr"


@pytest.fixture
def image_dir(tmp_path):
    """A CRIU image directory as the shim leaves it after a dump, signed with this node's key."""
    images = tmp_path / "images"
    images.mkdir()
    for name, data in (("inventory.img", b"inv"), ("core-1.img", b"\x01" * 300), ("pages-1.img", os.urandom(8192)),
                       ("descriptors.json", b'["/dev/null"]'), ("gpuckpt-manifest.json", b"{}")):
        (images / name).write_bytes(data)
    assert sign_dump(str(images)) == str(images / DUMP_SIGNATURE)
    (images / "restore.log").write_text("a log CRIU writes, read by no one at restore\n")
    return images


def refused(image_dir) -> str:
    with pytest.raises(SignatureError) as error:
        verify_dump(str(image_dir), load_trust(), WHAT)
    message = str(error.value)
    assert "\n" not in message and message.startswith(WHAT)
    return message


def test_a_signed_dump_verifies(image_dir) -> None:
    line, signed = verify_dump(str(image_dir), load_trust(), WHAT)
    assert signed and "signed at dump by this-node" in line and "5 files verified" in line


@pytest.mark.hostile("a dumped CRIU image with one byte of core-1.img changed (credentials live there)")
def test_a_changed_metadata_image_is_refused(image_dir) -> None:
    data = bytearray((image_dir / "core-1.img").read_bytes())
    data[10] ^= 1
    (image_dir / "core-1.img").write_bytes(bytes(data))
    assert "core-1.img does not match its sha256 signed at dump" in refused(image_dir)


@pytest.mark.hostile("a dumped CRIU image with a file added, one removed, pages resized, a symlink planted")
@pytest.mark.parametrize("change, message", [
    (lambda d: (d / "seccomp.img").write_bytes(b"x"), "seccomp.img is not among the files signed at dump"),
    (lambda d: (d / "descriptors.json").unlink(), "lacks descriptors.json, signed at dump"),
    (lambda d: (d / "pages-1.img").write_bytes(b"0" * 4096), "pages-1.img has 4096 bytes, signed 8192"),
    (lambda d: (d / "ids-1.img").symlink_to("/etc/shadow"), "ids-1.img is not a regular file"),
])
def test_the_directory_must_be_exactly_what_was_dumped(image_dir, change, message) -> None:
    change(image_dir)
    assert message in refused(image_dir)


@pytest.mark.hostile("a dumped CRIU image whose signature names a key this node does not trust")
def test_a_dump_signed_elsewhere_needs_that_key(image_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPUCKPT_TRUST_DIR", str(tmp_path / "other-node"))
    key_id = json.loads((image_dir / DUMP_SIGNATURE).read_text())["key_id"]
    assert f"signed by key {key_id}, which this node does not trust" in refused(image_dir)


@pytest.mark.hostile("an unsigned CRIU image directory (plain runc's dump)")
def test_unsigned_is_refused_unless_the_policy_allows_restore_any(image_dir, tmp_path) -> None:
    (image_dir / DUMP_SIGNATURE).unlink()
    assert "no gpuckpt-dump.sig" in refused(image_dir) and "allow-unsigned restore:any" in refused(image_dir)
    save_policy(TrustPolicy(allow_unsigned=[UnsignedSource(source="restore:any", note="plain runc's dumps")]))
    line, signed = verify_dump(str(image_dir), load_trust(), WHAT)
    assert not signed and "restore:any" in line
    logged = json.loads(open(os.environ["GPUCKPT_TRUST_LOG"]).read().splitlines()[-1])
    assert logged["source"] == "restore:any" and WHAT in logged["what"]


def test_a_node_without_a_key_signs_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPUCKPT_TRUST_DIR", str(tmp_path / "keyless"))
    (tmp_path / "images").mkdir()
    assert sign_dump(str(tmp_path / "images")) is None and not (tmp_path / "images" / DUMP_SIGNATURE).exists()


def listening_socket(path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    return server


def test_criu_lazy_pages_socket_and_log_are_neither_signed_nor_refused(image_dir) -> None:
    """runc's lazy migration runs `criu lazy-pages -D <images>`: its socket and log appear beside the images
    while the lazy restore reads them, and the dump is signed again when it completes."""
    with listening_socket(image_dir / "lazy-pages.socket"):
        (image_dir / "lazy-pages.log").write_text("the lazy-pages daemon's log\n")
        _, signed = verify_dump(str(image_dir), load_trust(), WHAT)
        assert signed
        assert sign_dump(str(image_dir))  # the completed lazy dump's signature, the daemon still there
        _, signed = verify_dump(str(image_dir), load_trust(), WHAT)
        assert signed


@pytest.mark.hostile("a socket planted in a dumped image directory under another name than CRIU's lazy-pages one")
def test_any_other_socket_is_refused(image_dir) -> None:
    with listening_socket(image_dir / "pages.socket"):
        assert "pages.socket is not a regular file" in refused(image_dir)
