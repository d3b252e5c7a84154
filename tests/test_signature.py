"""Signed checkpoints: the envelope, signing and verifying an archive as it streams, the trust
policy and `gpuckpt trust`; tampered, unsigned or untrusted input refused with one line."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile

import pytest
import zstandard
from cryptography.hazmat.primitives import serialization
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from podman_tars import podman_tar

from gpuckpt.cli.main import main
from gpuckpt.errors import ConfigError
from gpuckpt.oci.archive import decompressed, open_archive
from gpuckpt.oci.image_layout import ImageManifest
from gpuckpt.oci.podman_archive import copy_checked
from gpuckpt.trust.keys import (
    TrustPolicy,
    UnsignedSource,
    ensure_node_key,
    load_policy,
    load_trust,
    parse_policy,
    save_policy,
)
from gpuckpt.trust.provenance import (
    SIGNATURE_ANNOTATION,
    EntryDigests,
    ExportSigning,
    HashingReader,
    verify_archive_signature,
    verify_image_signature,
    write_archive_signature,
)
from gpuckpt.trust.signature import (
    SignatureError,
    Signer,
    TrustedKey,
    open_envelope,
    parse_envelope,
    parse_public_key,
    public_key_line,
)


@pytest.fixture
def trust_dir(tmp_path, monkeypatch):
    """A private /etc/gpuckpt and trust log."""
    monkeypatch.setenv("GPUCKPT_TRUST_DIR", str(tmp_path / "etc"))
    monkeypatch.setenv("GPUCKPT_TRUST_LOG", str(tmp_path / "log" / "trust.log"))
    return tmp_path / "etc"


def trusting(*signers: Signer) -> dict[str, TrustedKey]:
    return {signer.key_id: TrustedKey(f"node{index}", signer.public) for index, signer in enumerate(signers)}


def one_line(error: Exception) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


# the envelope

def test_a_signature_verifies_with_the_trusted_key_and_names_the_signer() -> None:
    signer = Signer.generate()
    envelope = signer.sign(signer.content("archive", [], archive_sha256="ab" * 32))
    content, key = open_envelope(envelope, trusting(Signer.generate(), signer), "a.sig", "archive")
    assert content.archive_sha256 == "ab" * 32 and content.key_id == signer.key_id and key.name == "node1"


@pytest.mark.hostile("a signature by a key the node does not trust")
def test_an_untrusted_key_is_refused_naming_its_id_and_how_to_trust_it() -> None:
    signer = Signer.generate()
    envelope = signer.sign(signer.content("archive", [], archive_sha256="ab" * 32))
    with pytest.raises(SignatureError) as refused:
        open_envelope(envelope, trusting(Signer.generate()), "a.sig", "archive")
    assert signer.key_id in one_line(refused.value) and "gpuckpt trust add" in str(refused.value)


@pytest.mark.hostile("a signed payload edited after signing (the archive digest changed)")
def test_an_edited_payload_does_not_verify() -> None:
    signer = Signer.generate()
    envelope = json.loads(signer.sign(signer.content("archive", [], archive_sha256="ab" * 32)))
    payload = base64.b64decode(envelope["payload"]).replace(b"ab" * 32, b"cd" * 32)
    envelope["payload"] = base64.b64encode(payload).decode()
    with pytest.raises(SignatureError, match="does not verify: the signed content was changed"):
        open_envelope(json.dumps(envelope).encode(), trusting(signer), "a.sig", "archive")


@pytest.mark.hostile("an image's signature presented as an archive's")
def test_a_signature_of_another_kind_is_refused() -> None:
    signer = Signer.generate()
    envelope = signer.sign(signer.content("image", [], layer_digest="sha256:" + "0" * 64))
    with pytest.raises(SignatureError, match="a signature of an image, not of an archive"):
        open_envelope(envelope, trusting(signer), "a.sig", "archive")


SIGNER = Signer.generate()
VALID = SIGNER.sign(SIGNER.content("archive", [], archive_sha256="ab" * 32))


def forged_envelope(payload: bytes, signature: bytes) -> bytes:
    """An envelope of the right shape naming the trusted key, its signature any 64 bytes: past the JSON, only
    the signature check stands between a payload (random, or content the caller would take) and the caller."""
    return json.dumps({"key_id": SIGNER.key_id, "payload": base64.b64encode(payload).decode(),
                       "signature": base64.b64encode(signature).decode()}).encode()


def archive_content(archive_sha256: str) -> bytes:
    return SIGNER.content("archive", [], archive_sha256=archive_sha256).model_dump_json(exclude_none=True).encode()


FORGED = st.builds(forged_envelope,
                   st.one_of(st.binary(max_size=512), st.builds(archive_content, st.text("0123456789abcdef",
                                                                                         min_size=64, max_size=64))),
                   st.binary(min_size=64, max_size=64))


@pytest.mark.hostile("random bytes as a signature envelope")
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(st.binary(max_size=2048), FORGED))
def test_envelope_parser_refuses_any_bytes_with_one_line(data: bytes) -> None:
    with pytest.raises(SignatureError) as refused:
        open_envelope(data, trusting(SIGNER), "fuzz.sig", "archive")
    assert one_line(refused.value).startswith("fuzz.sig: ")  # names what it refused


@pytest.mark.hostile("a valid envelope with bytes changed, cut or inserted")
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.integers(0, len(VALID) - 1), st.binary(min_size=0, max_size=8), st.integers(0, 8))
def test_a_mutated_envelope_is_refused_or_unchanged(at: int, inserted: bytes, cut: int) -> None:
    mutated = VALID[:at] + inserted + VALID[at + cut:]
    try:
        content, _ = open_envelope(mutated, trusting(SIGNER), "fuzz.sig", "archive")
    except SignatureError as error:
        one_line(error)
    else:  # JSON whitespace or an equivalent escape can change the bytes, never what was signed
        assert content == open_envelope(VALID, trusting(SIGNER), "ok.sig", "archive")[0]


@pytest.mark.hostile("JSON envelopes of every shape (wrong types, missing and extra keys)")
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.sampled_from(["schema_version", "payload_type", "key_id", "payload", "signature", "x"]),
                       st.one_of(st.none(), st.integers(), st.text(max_size=100), st.lists(st.integers()))))
def test_structured_envelopes_are_refused_with_one_line(document: dict) -> None:
    with pytest.raises(SignatureError) as refused:
        parse_envelope(json.dumps(document).encode(), "fuzz.sig")
    one_line(refused.value)


def test_public_keys_read_in_our_line_and_in_pem() -> None:
    signer = Signer.generate()
    pem = signer.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for text in (public_key_line(signer.public, "node-a"), pem.decode()):
        assert parse_public_key(text, "key").public_bytes_raw() == signer.public.public_bytes_raw()
    with pytest.raises(SignatureError, match="not a public key"):
        parse_public_key("ssh-ed25519 AAAA", "key")


# an archive signed while it streams, verified while it streams

def export(tmp_path, tar: bytes, signer: Signer) -> str:
    """What gpuckpt export does: entries hashed through copy_checked, compressed, ARCHIVE.sig."""
    digests, compressed = EntryDigests(), io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(compressed, closefd=False) as out:
        copy_checked(io.BytesIO(tar), out, "podman's export", observe=digests.observe)
    archive = tmp_path / "c.tar.zst"
    archive.write_bytes(compressed.getvalue())
    write_archive_signature(str(archive), hashlib.sha256(compressed.getvalue()).hexdigest(), digests.entries(), signer)
    return str(archive)


def import_(archive: str, trust, out=None) -> None:
    """What gpuckpt import does: signature first, then one pass that checks every entry."""
    verification = verify_archive_signature(archive, trust)
    with open_archive(archive) as raw:
        copy_checked(decompressed(verification.reader(raw)), out, archive, observe=verification.observe)
        verification.finish()


def recompressed(archive: str, change) -> None:
    """The archive unpacked, one entry's data changed, packed and compressed again (as an attacker would)."""
    data = zstandard.ZstdDecompressor().decompressobj().decompress(open(archive, "rb").read())
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar, tarfile.open(fileobj=out, mode="w",
                                                                     format=tarfile.PAX_FORMAT) as again:
        for member in tar:
            content = tar.extractfile(member).read() if member.isfile() else None
            member, content = change(member, content)
            if member is not None:
                again.addfile(member, io.BytesIO(content) if content is not None else None)
    with open(archive, "wb") as target:
        target.write(zstandard.ZstdCompressor().compress(out.getvalue()))


def test_a_signed_archive_verifies_entry_by_entry_and_whole(tmp_path, trust_dir) -> None:
    signer, _ = ensure_node_key()
    archive = export(tmp_path, podman_tar(), signer)
    out = io.BytesIO()
    import_(archive, load_trust(), out)
    assert out.getvalue()  # the checked stream went on


def flip_page_byte(member, content):
    if member.name == "checkpoint/pages-1.img":
        content = bytes([content[0] ^ 1]) + content[1:]
    return member, content


class Sink(io.BytesIO):
    """The output side, remembering whether the changed page's last bytes reached it."""


@pytest.mark.hostile("a signed archive with one byte of a pages entry changed and re-compressed")
def test_one_changed_page_byte_is_refused_before_the_entry_ends(tmp_path, trust_dir) -> None:
    signer, _ = ensure_node_key()
    archive = export(tmp_path, podman_tar(), signer)
    recompressed(archive, flip_page_byte)
    out = io.BytesIO()
    with pytest.raises(SignatureError) as refused:
        import_(archive, load_trust(), out)
    assert "'checkpoint/pages-1.img' does not match its signed sha256" in one_line(refused.value)
    assert len(out.getvalue()) < 4096 * 8  # the changed entry's data never fully went on


@pytest.mark.parametrize("change, message", [
    (lambda m, c: (m, c) if m.name != "spec.dump" else (None, None), "signed entry 'spec.dump' missing"),
    (lambda m, c: (setattr(m, "mode", 0o4755) or m, c) if m.name == "config.dump" else (m, c),
     "'config.dump' has mode 493, signed 420"),
    (lambda m, c: (setattr(m, "name", "checkpoint/criu.conf") or m, c) if m.name == "spec.dump" else (m, c),
     "'checkpoint/criu.conf' is not among the signed entries"),
])
@pytest.mark.hostile("a signed archive with an entry removed, its mode changed, or renamed")
def test_entries_must_be_exactly_the_signed_ones(tmp_path, trust_dir, change, message) -> None:
    signer, _ = ensure_node_key()
    archive = export(tmp_path, podman_tar(), signer)
    recompressed(archive, change)
    with pytest.raises(SignatureError) as refused:
        import_(archive, load_trust())
    assert message in one_line(refused.value)


@pytest.mark.hostile("a signed archive with bytes appended after its last zstd frame (entries unchanged)")
def test_the_archive_digest_is_checked_too(tmp_path, trust_dir) -> None:
    signer, _ = ensure_node_key()
    archive = export(tmp_path, podman_tar(), signer)
    with open(archive, "ab") as target:  # a skippable zstd frame: the tar inside is the same
        target.write((0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little") + b"evil")
    with pytest.raises(SignatureError, match="the archive's sha256 is .* changed after signing"):
        import_(archive, load_trust())


@pytest.mark.hostile("an archive signed by a node this one does not trust")
def test_an_archive_signed_elsewhere_needs_that_key(tmp_path, trust_dir) -> None:
    ensure_node_key()
    other = Signer.generate()
    archive = export(tmp_path, podman_tar(), other)
    with pytest.raises(SignatureError) as refused:
        import_(archive, load_trust())
    assert other.key_id in one_line(refused.value)
    key_file = tmp_path / "other.pub"
    key_file.write_text(public_key_line(other.public, "other") + "\n")
    assert main(["trust", "add", "node-b", str(key_file)]) == 0
    import_(archive, load_trust())


@pytest.mark.hostile("an unsigned archive")
def test_unsigned_is_refused_unless_its_source_is_allowed_and_that_is_logged(tmp_path, trust_dir, capsys) -> None:
    ensure_node_key()
    archive = tmp_path / "in" / "podmans.tar"
    archive.parent.mkdir()
    archive.write_bytes(podman_tar())
    with pytest.raises(SignatureError) as refused:
        import_(str(archive), load_trust())
    assert f"no signature ({archive}.sig)" in one_line(refused.value)
    assert f"gpuckpt trust allow-unsigned archive:{archive}" in str(refused.value)
    assert main(["trust", "allow-unsigned", f"archive:{archive.parent}/", "--note", "podman's own exports"]) == 0
    import_(str(archive), load_trust())
    assert f"{archive} is unsigned: accepted because" in capsys.readouterr().out
    logged = [json.loads(line) for line in (tmp_path / "log" / "trust.log").read_text().splitlines()]
    assert logged[-1]["what"] == str(archive) and logged[-1]["source"] == f"archive:{archive.parent}/"
    other = tmp_path / "elsewhere.tar"
    other.write_bytes(podman_tar())
    with pytest.raises(SignatureError, match="no signature"):
        import_(str(other), load_trust())


def test_hashing_reader_sees_the_whole_file_once_even_after_seeking_back(tmp_path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 << 20))
    with open(path, "rb") as raw:
        reader = HashingReader(raw)
        reader.read(4)
        reader.seek(0)
        reader.read(100)
        assert reader.hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()


# the image signature

def image_manifest(annotations: dict[str, str]) -> ImageManifest:
    descriptor = {"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": "sha256:" + "1" * 64,
                  "size": 10}
    config = {**descriptor, "mediaType": "application/vnd.oci.image.config.v1+json"}
    return ImageManifest(schemaVersion=2, config=config, layers=[descriptor], annotations=annotations)


@pytest.mark.parametrize("change, message", [
    (lambda a: a | {"io.podman.annotations.checkpoint.name": "other"},
     "annotation 'io.podman.annotations.checkpoint.name'"),
    (lambda a: a | {"org.criu.config": "/tmp/x"}, "annotation 'org.criu.config'"),
    (lambda a: {k: v for k, v in a.items() if k != SIGNATURE_ANNOTATION}, "no io.gpuckpt.signature annotation"),
])
@pytest.mark.hostile("a signed checkpoint image with an annotation changed, added, or the signature removed")
def test_an_image_signature_covers_every_annotation(trust_dir, change, message) -> None:
    signer, _ = ensure_node_key()
    signing = ExportSigning(signer)
    annotations = {"io.podman.annotations.checkpoint.name": "web"}
    annotations |= signing.image_signature("sha256:" + "1" * 64, annotations)
    assert verify_image_signature(image_manifest(annotations), load_trust(), "oci:x")[1] == "this-node"
    with pytest.raises(SignatureError) as refused:
        verify_image_signature(image_manifest(change(annotations)), load_trust(), "oci:x")
    assert message in one_line(refused.value)


# the trust policy and `gpuckpt trust`

def test_trust_commands_edit_the_policy_and_export_key_round_trips(tmp_path, trust_dir, capsys) -> None:
    signer, made = ensure_node_key()
    assert made and ensure_node_key()[0].key_id == signer.key_id  # idempotent: kept, never replaced
    assert oct((trust_dir / "node.key").stat().st_mode & 0o777) == "0o600"
    assert main(["trust", "export-key"]) == 0
    exported = capsys.readouterr().out
    assert parse_public_key(exported, "-").public_bytes_raw() == signer.public.public_bytes_raw()
    (tmp_path / "a.pub").write_text(public_key_line(Signer.generate().public))
    assert main(["trust", "add", "node-a", str(tmp_path / "a.pub")]) == 0
    assert main(["trust", "add", "node-b", str(tmp_path / "a.pub")]) == 2  # the same key twice
    assert "already trusted as node-a" in capsys.readouterr().err
    assert main(["trust", "list"]) == 0
    listed = capsys.readouterr().out
    assert f"this-node: {signer.key_id}" in listed and "node-a:" in listed
    assert [entry.name for entry in load_policy().key] == ["node-a"]
    assert main(["trust", "remove", "node-a"]) == 0 and load_policy().key == []
    assert main(["trust", "remove", "node-a"]) == 2


@pytest.mark.parametrize("text, message", [
    ('schema_version = 2\n', "schema_version"),
    ('[[key]]\nname = "a b"\npublic_key = "x"\n', "key.0.name"),
    ('[[key]]\nname = "a"\npublic_key = "gpuckpt-ed25519 AAAA"\n', "32 bytes"),
    ('[[allow_unsigned]]\nsource = "archive:relative/dir"\n', "archive:/ABSOLUTE/PATH"),
    ('[[allow_unsigned]]\nsource = "anything"\n', "restore:any"),
    ('unsigned_ok = true\n', "unknown key 'unsigned_ok'"),
])
@pytest.mark.hostile("a trust policy with a bad value or an unknown key")
def test_a_bad_policy_is_one_line_naming_the_key(text, message) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_policy(text, "trust.toml")
    assert message in one_line(refused.value)


def test_a_policy_round_trips_through_its_file(trust_dir) -> None:
    key = public_key_line(Signer.generate().public)
    policy = TrustPolicy(key=[{"name": "n1", "public_key": key}],
                         allow_unsigned=[UnsignedSource(source="archive:/var/lib/old/", note='say "why"')])
    path = save_policy(policy)
    assert load_policy(path) == policy and oct(os.stat(path).st_mode & 0o777) == "0o644"


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership is checked only when root reads the files")
@pytest.mark.hostile("a trust policy or node key writable (or readable) by others")
def test_root_refuses_files_others_may_write(trust_dir) -> None:
    ensure_node_key()
    path = save_policy(TrustPolicy())
    os.chmod(path, 0o666)
    with pytest.raises(ConfigError, match="must be owned by root and writable by root only"):
        load_trust()
    os.chmod(path, 0o644)
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError, match="must be owned by root"):
        load_trust()
    os.chown(path, 0, 0)
    os.chmod(trust_dir / "node.key", 0o644)
    with pytest.raises(ConfigError, match=r"node.key: must be owned by root and readable and writable by root only"):
        load_trust()


@pytest.mark.hostile("a link swapped between the unsigned-input rule's check and the archive's read")
def test_an_unsigned_archive_is_read_from_the_file_the_rule_allowed(tmp_path, trust_dir) -> None:
    ensure_node_key()
    allowed = tmp_path / "trusted" / "podmans.tar"
    allowed.parent.mkdir()
    allowed.write_bytes(podman_tar())
    assert main(["trust", "allow-unsigned", f"archive:{allowed.parent}/"]) == 0
    elsewhere = tmp_path / "elsewhere.tar"
    elsewhere.write_bytes(podman_tar())
    link = tmp_path / "given.tar"
    link.symlink_to(allowed)
    verification = verify_archive_signature(str(link), load_trust())  # decided for the trusted file
    link.unlink()
    link.symlink_to(elsewhere)  # then the path names another
    with open_archive(str(link)) as raw, pytest.raises(SignatureError) as refused:
        verification.reader(raw)
    assert f"{link}: not the file the trust policy allowed unsigned" in one_line(refused.value)
    link.unlink()
    link.symlink_to(allowed)
    import_(str(link), load_trust())  # unchanged, it goes through
