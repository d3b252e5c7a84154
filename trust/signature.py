"""Signed checkpoints: the signature envelope (a format with a schema version) and Ed25519 keys.

An envelope carries a payload (JSON, base64) and one Ed25519 signature over a fixed prefix, the
payload type and the payload bytes, so what is verified is exactly what is then read. The
payload (`SignedContent`) lists what was signed: every entry's name, type, mode, size and
sha256, and the archive's own sha256 (archives) or the layer digest and the other manifest
annotations (images). Reading trusts nothing: bounded, schema-checked, the signature checked
with a trusted key before the payload is parsed at all.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ImageError
from ..oci.problems import first_problem
from ..oci.timestamps import utc_now

SCHEMA_VERSION: Final = 1
PAYLOAD_TYPE: Final = "application/vnd.gpuckpt.signed-content.v1+json"
SignedKind = Literal["archive", "image", "dump"]
SIGNED_PREFIX = b"gpuckpt-signature-v1\n"
PUBLIC_KEY_KIND = "gpuckpt-ed25519"
KEY_ID = re.compile(r"[0-9a-f]{16}")
SHA256_HEX = r"^[0-9a-f]{64}$"
MAX_ENVELOPE_BYTES = 32 << 20  # 100,000 entries of ~200 bytes, base64
MAX_ENTRIES = 100_000  # oci.tarstream's bound on an archive
MAX_ENTRY_BYTES = 1 << 40  # oci.archive's bound on one entry
MAX_KEY_TEXT_BYTES = 4096


class SignatureError(ImageError):
    """A signature is absent, malformed, made by an untrusted key, or does not match."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SignedEntry(_Strict):
    """One tar entry as signed: what podman will unpack, byte for byte."""

    name: str = Field(min_length=1, max_length=4096)
    type: Literal["file", "dir"] = "file"
    mode: int = Field(default=0o600, ge=0, le=0o777)
    size: int = Field(default=0, ge=0, le=MAX_ENTRY_BYTES)
    sha256: str | None = Field(default=None, pattern=SHA256_HEX)


class SignedContent(_Strict):
    """What a signature vouches for."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: SignedKind
    key_id: str = Field(pattern=rf"^{KEY_ID.pattern}$")
    created: str = Field(max_length=64)
    archive_sha256: str | None = Field(default=None, pattern=SHA256_HEX)  # archive: the compressed file
    layer_digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")  # image: the layer blob
    annotations: dict[str, str] | None = None  # image: every other manifest annotation, exactly
    entries: list[SignedEntry] = Field(default=[], max_length=MAX_ENTRIES)

    @field_validator("entries")
    @classmethod
    def _names_are_unique(cls, entries: list[SignedEntry]) -> list[SignedEntry]:
        if len({entry.name for entry in entries}) != len(entries):
            raise ValueError("an entry is listed twice")
        return entries


class Envelope(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    payload_type: Literal["application/vnd.gpuckpt.signed-content.v1+json"] = PAYLOAD_TYPE
    key_id: str = Field(pattern=rf"^{KEY_ID.pattern}$")
    payload: str = Field(max_length=MAX_ENVELOPE_BYTES)  # base64 of the SignedContent JSON
    signature: str = Field(min_length=88, max_length=88)  # base64 of 64 bytes


def _signed_bytes(payload: bytes) -> bytes:
    return SIGNED_PREFIX + PAYLOAD_TYPE.encode() + b"\n" + payload


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise SignatureError(f"{what}: not base64") from None


def key_id_of(public: Ed25519PublicKey) -> str:
    """The first 64 bits of the sha256 of the raw public key: a name for it, never its proof."""
    return hashlib.sha256(_raw(public)).hexdigest()[:16]


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_line(public: Ed25519PublicKey, comment: str = "") -> str:
    """`gpuckpt-ed25519 BASE64 [COMMENT]`: what `gpuckpt trust export-key` prints and `trust add` reads."""
    text = f"{PUBLIC_KEY_KIND} {base64.b64encode(_raw(public)).decode()}"
    return f"{text} {comment}" if comment else text


def parse_public_key(text: str, what: str) -> Ed25519PublicKey:
    """A public key from our one-line form or a PEM SubjectPublicKeyInfo; a SignatureError names `what`."""
    text = text.strip()
    if len(text) > MAX_KEY_TEXT_BYTES:
        raise SignatureError(f"{what}: longer than {MAX_KEY_TEXT_BYTES} bytes: not a public key")
    if text.startswith("-----BEGIN PUBLIC KEY-----"):
        try:
            public = serialization.load_pem_public_key(text.encode("ascii"))
        except (ValueError, UnicodeEncodeError, TypeError) as error:
            raise SignatureError(f"{what}: not a PEM public key: {error}") from None
        if not isinstance(public, Ed25519PublicKey):
            raise SignatureError(f"{what}: a {type(public).__name__}, not an Ed25519 public key")
        return public
    fields = text.split()
    if len(fields) < 2 or fields[0] != PUBLIC_KEY_KIND:
        raise SignatureError(f"{what}: not a public key: give the line `gpuckpt trust export-key` prints "
                             f"({PUBLIC_KEY_KIND} BASE64 [NAME]) or a PEM Ed25519 public key")
    raw = _b64decode(fields[1], what)
    if len(raw) != 32:
        raise SignatureError(f"{what}: an Ed25519 public key has 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True)
class TrustedKey:
    name: str
    public: Ed25519PublicKey


class Signer:
    """A private key that signs; `key_id` names its public half."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self.private = private
        self.public = private.public_key()
        self.key_id = key_id_of(self.public)

    @classmethod
    def generate(cls) -> "Signer":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: bytes, what: str) -> "Signer":
        try:
            private = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as error:
            raise SignatureError(f"{what}: not a PEM private key: {error}") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise SignatureError(f"{what}: a {type(private).__name__}, not an Ed25519 private key")
        return cls(private)

    def pem(self) -> bytes:
        return self.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())

    def content(self, kind: SignedKind, entries: list[SignedEntry], **fields: Any) -> SignedContent:
        created = utc_now()
        return SignedContent(kind=kind, key_id=self.key_id, created=created, entries=entries, **fields)

    def sign(self, content: SignedContent) -> bytes:
        """The envelope's JSON bytes."""
        payload = content.model_dump_json(exclude_none=True).encode()
        signature = self.private.sign(_signed_bytes(payload))
        envelope = Envelope(key_id=self.key_id, payload=base64.b64encode(payload).decode(),
                            signature=base64.b64encode(signature).decode())
        return envelope.model_dump_json().encode()


def parse_envelope(data: bytes, what: str) -> Envelope:
    """The envelope's structure, bounded and checked; nothing in it is trusted yet."""
    if len(data) > MAX_ENVELOPE_BYTES:
        raise SignatureError(f"{what}: larger than {MAX_ENVELOPE_BYTES} bytes: not a gpuckpt signature")
    try:
        return Envelope.model_validate_json(data)
    except ValidationError as error:
        raise SignatureError(f"{what}: not a gpuckpt signature ({first_problem(error)})") from None


def untrusted_key_message(what: str, key_id: str) -> str:
    return (f"{what}: signed by key {key_id}, which this node does not trust (to trust it: on the node that "
            f"signed, `gpuckpt trust export-key`; here, `gpuckpt trust add NAME FILE` with what it printed)")


def open_envelope(data: bytes, trusted: Mapping[str, TrustedKey], what: str,
                  kind: str) -> tuple[SignedContent, TrustedKey]:
    """The signed content of `data` and the trusted key that signed it; a SignatureError (one line
    naming the key id) if the key is not trusted, the signature does not verify, or the content
    is not of `kind`."""
    envelope = parse_envelope(data, what)
    signer = trusted.get(envelope.key_id)
    if signer is None:
        raise SignatureError(untrusted_key_message(what, envelope.key_id))
    payload = _b64decode(envelope.payload, what)
    try:
        signer.public.verify(_b64decode(envelope.signature, what), _signed_bytes(payload))
    except InvalidSignature:
        raise SignatureError(f"{what}: the signature by key {envelope.key_id} ({signer.name}) does not verify: "
                             "the signed content was changed after signing") from None
    try:
        content = SignedContent.model_validate_json(payload)
    except (ValidationError, RecursionError) as error:
        raise SignatureError(f"{what}: signed content is not valid: {str(error).splitlines()[0]}") from None
    if content.key_id != envelope.key_id:
        raise SignatureError(f"{what}: signed content names key {content.key_id}, the envelope {envelope.key_id}")
    if content.kind != kind:
        raise SignatureError(f"{what}: a signature of {'an' if content.kind[0] in 'aei' else 'a'} {content.kind}, "
                             f"not of {'an' if kind[0] in 'aei' else 'a'} {kind}")
    return content, signer
