"""What `gpuckpt` prints for people and for scripts: the `--json` documents (one pydantic model each, with a
schema version: docs/cli-output.md lists them) and the text helpers every view shares (sizes, counts; a
container as `podman ps` names it is node.container_record's container_label, which gpuckptd's lines use too).

The text and the JSON of a command come from the same data: the command fills a model, prints it as JSON
with --json, and otherwise prints its lines from the model.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION: Literal[1] = 1
def size_text(count_bytes: int) -> str:
    """Bytes in binary units, in the largest unit that keeps the number at 1 or more ("512 B", "38 KiB",
    "742 MiB", "1.5 GiB"): a small checkpoint was "0 MiB"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count_bytes >= 1 << shift:
            value = count_bytes / (1 << shift)
            return f"{value:.1f} {unit}" if unit == "GiB" and value < 10 else f"{value:.0f} {unit}"
    return f"{count_bytes} B"


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """"1 checkpoint", "3 checkpoints"."""
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


class Document(BaseModel):
    """One command's --json answer."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = SCHEMA_VERSION

    def print_json(self) -> None:
        print(self.model_dump_json(indent=2))

    def emit(self, as_json: bool, text: str) -> None:
        """The document as JSON, or `text`: the line for people, made from it."""
        if as_json:
            self.print_json()
        else:
            print(text)


class DoctorCheck(BaseModel):
    check: str  # the check function's name without check_ (kernel, criu, trust, ...)
    level: Literal["ok", "warn", "fail", "skip"]
    message: str
    fix: str = ""


class DoctorReport(Document):
    kind: Literal["doctor"] = "doctor"
    checks: list[DoctorCheck]
    failed: int
    warned: int


class TrustedKey(BaseModel):
    name: str
    key_id: str
    added: str | None


class UnsignedException(BaseModel):
    source: str
    note: str


class TrustList(Document):
    kind: Literal["trust-list"] = "trust-list"
    node_key_id: str | None  # None: this node has no signing key yet
    node_key_path: str
    keys: list[TrustedKey]
    unsigned_allowed: list[UnsignedException]
    policy_path: str


class TrustVerification(Document):
    kind: Literal["trust-verify"] = "trust-verify"
    target: str
    signed: bool  # False: unsigned, allowed by an exception of the trust policy
    signer: str | None = None  # the trusted key's name
    key_id: str | None = None
    signed_at: str | None = None
    entries: int | None = None  # an archive's signed entries
    layer_digest: str | None = None  # a checkpoint image's verified layer


class StoredRow(BaseModel):
    name: str
    container: str
    container_id: str
    short_id: str
    created: str
    logical_bytes: int
    new_bytes: int
    new_stored_bytes: int


class StoreList(Document):
    kind: Literal["store-list"] = "store-list"
    store: str
    checkpoints: list[StoredRow]


class ExportResult(Document):
    kind: Literal["export"] = "export"
    container: str
    container_id: str
    short_id: str
    output: str
    checkpoint_bytes: int
    seconds: float
    key_id: str
    signature: str  # where the signature went: the .sig file, or the image manifest


class ImportResult(Document):
    kind: Literal["import"] = "import"
    archive: str
    container: str  # the restored container's name (--name's, where given)
    container_id: str  # podman's ID of the restored container
    short_id: str
    checkpointed_container: str  # the name in the archive
    seconds: float
    provenance: str  # "signed by NAME", or unsigned and allowed by which exception
    phases: list[str]


class Inspected(Document):
    """`gpuckpt inspect --json`: what a checkpoint holds; `manifest` is gpuckpt's manifest (oci/manifest.py)
    as stored, None where the checkpoint was not made through gpuckpt-runtime."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["podman-archive", "podman-directory", "podman-image", "oci-image", "directory"]
    path: str
    files: int
    bytes: int
    stored_bytes: int
    engine: str | None
    container: dict[str, Any] | None
    manifest: dict[str, Any] | None
    image: dict[str, Any] | None = None
