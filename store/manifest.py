"""A stored checkpoint's manifest: what a checkpoint is, in the store (schema 1).

The entries of podman's export, in its order (config.dump before checkpoint/, the GPU manifest
before the pages: imports rely on it), each file as the chunks its bytes cut into. Read back as
data: every name is bounded and checked (relative, no `..`), every chunk a hex digest with a size
the chunker can make, the counts bounded, before anything is opened by it.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ImageError, UsageError
from ..oci.tarstream import MAX_ENTRIES, MAX_MEMBER_BYTES
from .chunking import MAX_CHUNK_BYTES

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a checkpoint's name is a file name in the store
NAME_RULE = "letters, digits, '_', '.', '-', starting with a letter or digit, at most 128"
MAX_MANIFEST_BYTES = 256 << 20  # ~2.5 million chunks: 800 GB of checkpoint
MAX_CHUNKS = 4_000_000

Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
ChunkSize = Annotated[int, Field(ge=1, le=MAX_CHUNK_BYTES)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoredEntry(_Model):
    """One entry of the export: a directory, or a file as its chunks (digest, bytes) in order."""

    name: str = Field(min_length=1, max_length=4096)
    type: Literal["file", "dir"] = "file"
    mode: int = Field(ge=0, le=0o777)
    mtime: int = Field(ge=0, lt=2**33)
    size: int = Field(default=0, ge=0, le=MAX_MEMBER_BYTES)
    chunks: list[tuple[Digest, ChunkSize]] = []

    @field_validator("name")
    @classmethod
    def _inside(cls, name: str) -> str:
        if name.startswith("/") or "\0" in name or posixpath.normpath(name) != name or name.split("/")[0] == "..":
            raise ValueError(f"{name[:80]!r} is not a relative, normalised path inside the checkpoint")
        return name

    @model_validator(mode="after")
    def _sizes_add_up(self) -> StoredEntry:
        if sum(size for _, size in self.chunks) != self.size or (self.type == "dir" and self.size):
            raise ValueError(f"entry {self.name[:80]!r}: its chunks hold other than its {self.size} bytes")
        return self


class StoredCheckpoint(_Model):
    """`checkpoints/NAME.json`: written once the last chunk is on disk, by a rename."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=f"^{NAME.pattern}$")
    container: str = Field(max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$")  # podman's name of it, for people
    container_id: str = Field(pattern=r"^[0-9a-f]{64}$")
    created: str = Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$")  # UTC
    created_ns: int = Field(ge=0)  # the same, to order checkpoints
    entries: list[StoredEntry] = Field(max_length=MAX_ENTRIES)
    logical_bytes: int = Field(ge=0)  # the files' bytes
    new_bytes: int = Field(ge=0)  # of them, in chunks this checkpoint wrote (the store had none of them)
    new_stored_bytes: int = Field(ge=0)  # those chunks compressed, on disk

    @model_validator(mode="after")
    def _bounded(self) -> StoredCheckpoint:
        if sum(len(entry.chunks) for entry in self.entries) > MAX_CHUNKS:
            raise ValueError(f"more than {MAX_CHUNKS} chunks")
        if len({entry.name for entry in self.entries}) != len(self.entries):
            raise ValueError("an entry appears twice")
        if self.logical_bytes != sum(entry.size for entry in self.entries):
            raise ValueError("logical_bytes is not the sum of its entries")
        return self

    def digests(self) -> dict[str, int]:
        """Every chunk it references, once, with its bytes."""
        return {digest: size for entry in self.entries for digest, size in entry.chunks}


def parse_stored(data: bytes, what: str) -> StoredCheckpoint:
    try:
        return StoredCheckpoint.model_validate_json(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ImageError(f"{what}: not a valid stored checkpoint: {where}: {first['msg']}"[:400]) from None


def check_name(name: str, what: str = "checkpoint name") -> str:
    if not NAME.fullmatch(name):
        raise UsageError(f"{what} {name[:80]!r}: use {NAME_RULE} characters")
    return name
