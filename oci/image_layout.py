"""The checkpoint OCI image, as an OCI image layout directory: written streaming, read checked.

`podman container checkpoint --create-image` makes an image of one layer whose files are
exactly its export archive (config.dump, spec.dump, checkpoint/, ...), with the annotations
`io.podman.annotations.checkpoint.*` in the image manifest; `podman container restore IMAGE`
and CRI-O restore from it. We write the same image, its layer compressed with multithreaded
zstd as it streams (the layer digest and diff ID hashed on the way, no second pass), into a
layout directory that skopeo copies to a registry (`oci:DIR:TAG`).

Reading trusts nothing: digests must be sha256 hex (they name files), sizes must match.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import platform
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, BinaryIO, TypeVar, cast

import zstandard
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ImageError, UsageError
from ..host.facts import checkpoint_host_annotations
from ..host.safefiles import (
    create_private_at,
    make_directories,
    make_directory_at,
    read_bounded,
    write_private_at,
)
from .archive import HashingWriter, close_quietly, zstd_compressor
from .timestamps import utc_now

if TYPE_CHECKING:
    from .podman_archive import PodmanArchive

ModelT = TypeVar("ModelT", bound=BaseModel)

LAYOUT_FILE = "oci-layout"
INDEX_FILE = "index.json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPES = {"application/vnd.oci.image.layer.v1.tar+zstd", "application/vnd.oci.image.layer.v1.tar+gzip",
               "application/vnd.oci.image.layer.v1.tar"}
ZSTD_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"
REF_NAME = "org.opencontainers.image.ref.name"
CHECKPOINT_ANNOTATION = "io.podman.annotations.checkpoint"  # prefix of podman's keys
IMAGE_CREATED = "org.opencontainers.image.created"
CRIO_CHECKPOINT_ANNOTATION = "io.kubernetes.cri-o.annotations.checkpoint"  # CRI-O's (Kubernetes), same suffixes
MAX_JSON_BYTES = 4 << 20
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class _Json(BaseModel):
    model_config = ConfigDict(extra="allow")


class Descriptor(_Json):
    mediaType: str
    digest: str
    size: int = Field(ge=0)
    annotations: dict[str, str] | None = None


class ImageManifest(_Json):
    schemaVersion: int
    mediaType: str = MANIFEST_TYPE
    config: Descriptor
    layers: list[Descriptor]
    annotations: dict[str, str] | None = None


class ImageIndex(_Json):
    schemaVersion: int
    manifests: list[Descriptor]


class RootFs(_Json):
    type: str = "layers"
    diff_ids: list[str]


class HistoryEntry(_Json):
    created: str
    created_by: str = ""


class ImageConfig(_Json):
    created: str
    architecture: str
    os: str = "linux"
    config: dict[str, Any] = {}
    rootfs: RootFs
    history: list[HistoryEntry] = []


class LayoutVersion(_Json):
    imageLayoutVersion: str = "1.0.0"


def parse_target(target: str) -> tuple[str, str] | None:
    """`oci:DIR[:TAG]` (skopeo's transport syntax) as (DIR, TAG); None for anything else."""
    if not target.startswith("oci:"):
        return None
    directory, _, tag = target[len("oci:"):].partition(":")
    tag = tag or "latest"
    if not directory or not TAG.fullmatch(tag):
        raise UsageError(f"{target}: give oci:DIRECTORY[:TAG], the tag made of letters, digits, '.', '_', '-'")
    return os.path.abspath(directory), tag


def _json_bytes(model: BaseModel) -> bytes:
    return json.dumps(model.model_dump(exclude_defaults=False, exclude_none=True), separators=(",", ":")).encode()


class CheckpointImageWriter:
    """One checkpoint image into a new layout directory (root-only: it holds process memory).

    `layer()` gives the stream the uncompressed layer tar is written to; `finish()` adds
    the config, manifest and index. Nothing is left behind on failure (`discard()`). Below the
    directory's parent (the operator's: a link there is followed), the directory, blobs/sha256
    and every file are made here and reached through descriptors (mkdirat, openat with
    O_NOFOLLOW, renameat), so a link swapped in meanwhile is never followed.
    """

    # (layer digest, annotations) -> annotations to add, the signature (transfer.provenance); None: unsigned
    sign: Callable[[str, dict[str, str]], dict[str, str]] | None = None

    def __init__(self, directory: str, tag: str, threads: int = 0) -> None:
        self.directory, self.tag, self.threads = directory, tag, threads
        self.name = os.path.basename(directory)
        self.parent_fd = self.dir_fd = self.blobs_fd = -1
        self.made = False
        self._file: BinaryIO | None = None
        self._compressed: HashingWriter | None = None
        self._tar_side: HashingWriter | None = None
        self._zstd: zstandard.ZstdCompressionWriter | None = None
        refused = UsageError(f"{directory}: already exists; give a new directory, or an empty one of yours, "
                             "for the image layout")
        try:
            self.parent_fd, self.dir_fd, self.made = make_directories(directory)
            if not self.made and (os.fstat(self.dir_fd).st_uid != os.geteuid() or os.listdir(self.dir_fd)):
                raise refused
            os.fchmod(self.dir_fd, 0o700)
            sha256_parent, _ = make_directory_at(self.dir_fd, "blobs")
            try:
                self.blobs_fd, _ = make_directory_at(sha256_parent, "sha256")
            finally:
                os.close(sha256_parent)
        except OSError as error:
            self.discard()
            if error.errno in (errno.ELOOP, errno.ENOTDIR):  # a link or a file where a directory goes
                raise refused from None
            raise UsageError(f"{directory}: cannot make the image layout: {error.strerror}") from None
        except BaseException:
            self.discard()
            raise
        self.blobs = os.path.join(directory, "blobs", "sha256")
        self._partial = f".layer-{os.getpid()}.partial"
        self.layer_digest = self.diff_id = ""
        self.layer_size = 0

    def layer(self) -> HashingWriter:
        fd = create_private_at(self.blobs_fd, self._partial)
        self._file = os.fdopen(fd, "wb")
        self._compressed = HashingWriter(self._file)
        # a writer: write and flush are all stream_writer uses
        self._zstd = zstd_compressor(self.threads).stream_writer(cast(IO[bytes], self._compressed), closefd=False)
        self._tar_side = HashingWriter(self._zstd)
        return self._tar_side

    def _close_layer(self) -> None:
        if self._file is None or self._zstd is None or self._compressed is None or self._tar_side is None:
            raise ImageError("checkpoint image: the layer was never written")
        self._zstd.close()
        self._file.close()
        self.layer_digest, self.layer_size = self._compressed.digest, self._compressed.size
        self.diff_id = self._tar_side.digest
        os.replace(self._partial, self._blob(self.layer_digest), src_dir_fd=self.blobs_fd, dst_dir_fd=self.blobs_fd)

    @staticmethod
    def _blob(digest: str) -> str:
        """A blob's name in blobs/sha256."""
        return digest.removeprefix("sha256:")

    def _add_blob(self, data: bytes, media_type: str) -> Descriptor:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        write_private_at(self.blobs_fd, self._blob(digest), data)
        return Descriptor(mediaType=media_type, digest=digest, size=len(data))

    def write_file(self, name: str, data: bytes) -> None:
        """A new root-only file at the top of the layout."""
        write_private_at(self.dir_fd, name, data)

    def finish(self, archive: PodmanArchive) -> str:
        """Complete the layout for the checked archive that went into the layer; the manifest digest."""
        self._close_layer()
        annotations, architecture, created = checkpoint_annotations(archive), go_architecture(), utc_now()
        annotations[IMAGE_CREATED] = created  # podman 5 writes it too (the image spec's key)
        if self.sign is not None:
            annotations |= self.sign(self.layer_digest, annotations)
        config = ImageConfig(created=created, architecture=architecture,
                             rootfs=RootFs(diff_ids=[self.diff_id]),
                             history=[HistoryEntry(created=created, created_by="gpuckpt export")])
        manifest = ImageManifest(schemaVersion=2, config=self._add_blob(_json_bytes(config), CONFIG_TYPE),
                                 layers=[Descriptor(mediaType=ZSTD_LAYER_TYPE, digest=self.layer_digest,
                                                    size=self.layer_size)],
                                 annotations=annotations)
        manifest_descriptor = self._add_blob(_json_bytes(manifest), MANIFEST_TYPE)
        manifest_descriptor.annotations = {REF_NAME: self.tag}
        index = ImageIndex(schemaVersion=2, manifests=[manifest_descriptor])
        self.write_file(LAYOUT_FILE, _json_bytes(LayoutVersion()))
        self.write_file(INDEX_FILE, _json_bytes(index))
        self._close_directories()
        return manifest_descriptor.digest

    def _close_directories(self) -> None:
        for fd in (self.blobs_fd, self.dir_fd, self.parent_fd):
            if fd >= 0:
                os.close(fd)
        self.parent_fd = self.dir_fd = self.blobs_fd = -1

    def discard(self) -> None:
        """Remove what was made: the directory, or what was put in the empty one that was there."""
        close_quietly(self._zstd, self._file)
        if self.made and self.parent_fd >= 0:
            shutil.rmtree(self.name, ignore_errors=True, dir_fd=self.parent_fd)
        elif self.dir_fd >= 0:
            shutil.rmtree("blobs", ignore_errors=True, dir_fd=self.dir_fd)
            for name in (LAYOUT_FILE, INDEX_FILE):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=self.dir_fd)
        self._close_directories()


def go_architecture() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}.get(machine, machine)


def checkpoint_annotations(archive: PodmanArchive) -> dict[str, str]:
    """The annotations podman's `restore IMAGE` and CRI-O's restore read, and ours."""
    config = archive.config
    annotations: dict[str, str] = {}
    for key in (CHECKPOINT_ANNOTATION, CRIO_CHECKPOINT_ANNOTATION):
        annotations |= {f"{key}.name": config.name, f"{key}.rawImageName": config.RawImageName,
                        f"{key}.rootfsImageID": config.rootfsImageID, f"{key}.rootfsImageName": config.rootfsImageName}
    key = CHECKPOINT_ANNOTATION
    annotations |= {f"{key}.runtime.name": config.runtime, f"{key}.host.arch": go_architecture(),
                    f"{key}.host.kernel": platform.release()}
    annotations |= checkpoint_host_annotations(config.runtime)  # as podman's --create-image writes them
    if archive.manifest is not None:
        annotations["io.gpuckpt.manifest.schema_version"] = str(archive.manifest.schema_version)
        annotations["io.gpuckpt.cuda.processes"] = str(len(archive.manifest.processes))
        annotations["io.gpuckpt.gpus"] = ",".join(gpu.uuid for gpu in archive.manifest.gpus)
    return annotations


@dataclass
class CheckpointImage:
    """A checked layout: the tagged manifest and the path of its one layer."""

    directory: str
    tag: str
    manifest: ImageManifest
    layer_path: str
    layer: Descriptor


def _read_json(path: str, model: type[ModelT], what: str) -> ModelT:
    data = read_bounded(path, MAX_JSON_BYTES, what)
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        raise ImageError(f"{what}: not a valid {model.__name__}: {str(error).splitlines()[0]}") from None


def _blob_path(directory: str, descriptor: Descriptor, what: str) -> str:
    if not DIGEST.fullmatch(descriptor.digest):
        raise ImageError(f"{directory}: {what} digest {descriptor.digest!r} is not sha256:<64 hex digits>")
    path = os.path.join(directory, "blobs", "sha256", descriptor.digest.removeprefix("sha256:"))
    try:
        size = os.lstat(path).st_size
    except OSError:
        raise ImageError(f"{directory}: {what} blob {descriptor.digest} is missing") from None
    if not os.path.isfile(path) or os.path.islink(path):
        raise ImageError(f"{directory}: {what} blob {descriptor.digest} is not a regular file")
    if size != descriptor.size:
        raise ImageError(f"{directory}: {what} blob {descriptor.digest} has {size} bytes, declared {descriptor.size}")
    return path


def _verified_json(directory: str, descriptor: Descriptor, model: type[ModelT], what: str) -> ModelT:
    path = _blob_path(directory, descriptor, what)
    if descriptor.size > MAX_JSON_BYTES:
        raise ImageError(f"{directory}: {what} declares {descriptor.size} bytes, more than {MAX_JSON_BYTES}")
    data = read_bounded(path, MAX_JSON_BYTES, f"{directory}: {what}")
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != descriptor.digest:
        raise ImageError(f"{directory}: {what} blob does not match its digest {descriptor.digest}")
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        raise ImageError(f"{directory}: {what} is not valid: {str(error).splitlines()[0]}") from None


MAX_TAGS_SHOWN = 20


def _tag_of(descriptor: Descriptor) -> str:
    """The descriptor's image name if it is a tag ("" if not): the layout's bytes, printed to a terminal."""
    name = (descriptor.annotations or {}).get(REF_NAME, "")
    return name if TAG.fullmatch(name) else ""


def is_layout(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, LAYOUT_FILE))


def read_layout(directory: str, tag: str | None = None) -> CheckpointImage:
    """The checkpoint image tagged `tag` (or the only one) in a layout directory, checked."""
    layout = _read_json(os.path.join(directory, LAYOUT_FILE), LayoutVersion, f"{directory}/{LAYOUT_FILE}")
    if not layout.imageLayoutVersion.startswith("1."):
        raise ImageError(f"{directory}: image layout version {layout.imageLayoutVersion}; 1.x is supported")
    index = _read_json(os.path.join(directory, INDEX_FILE), ImageIndex, f"{directory}/{INDEX_FILE}")
    if index.schemaVersion != 2:
        raise ImageError(f"{directory}/{INDEX_FILE}: schemaVersion {index.schemaVersion}; 2 is supported")
    candidates = [d for d in index.manifests if tag is None or (d.annotations or {}).get(REF_NAME) == tag]
    if len(candidates) != 1:
        names = sorted({_tag_of(d) or "(untagged, or a name that is no tag)" for d in index.manifests})
        more = f" and {len(names) - MAX_TAGS_SHOWN} more" if len(names) > MAX_TAGS_SHOWN else ""
        tags = (", ".join(names[:MAX_TAGS_SHOWN]) or "none") + more
        raise ImageError(f"{directory}: {'tag ' + tag if tag else 'one image'} wanted; the layout holds: {tags}")
    manifest = _verified_json(directory, candidates[0], ImageManifest, "image manifest")
    if manifest.schemaVersion != 2 or manifest.mediaType != MANIFEST_TYPE:
        raise ImageError(f"{directory}: image manifest schemaVersion {manifest.schemaVersion}, mediaType "
                         f"{manifest.mediaType}: an OCI image manifest (2, {MANIFEST_TYPE}) is supported")
    if len(manifest.layers) != 1 or manifest.layers[0].mediaType not in LAYER_TYPES:
        raise ImageError(f"{directory}: not a checkpoint image: it must have one tar layer, "
                         f"not {[layer.mediaType for layer in manifest.layers]}")
    if not any(
        key.startswith((CHECKPOINT_ANNOTATION, CRIO_CHECKPOINT_ANNOTATION)) for key in manifest.annotations or {}
    ):
        raise ImageError(f"{directory}: not a checkpoint image: no {CHECKPOINT_ANNOTATION}.* or "
                         f"{CRIO_CHECKPOINT_ANNOTATION}.* annotations")
    layer = manifest.layers[0]
    return CheckpointImage(directory, _tag_of(candidates[0]), manifest,
                           _blob_path(directory, layer, "layer"), layer)


def verify_layer(image: CheckpointImage) -> None:
    """The layer blob hashes to its digest (read once more, in 4 MiB pieces)."""
    digest = hashlib.sha256()
    with open(image.layer_path, "rb") as blob:
        while piece := blob.read(4 << 20):
            digest.update(piece)
    if f"sha256:{digest.hexdigest()}" != image.layer.digest:
        raise ImageError(f"{image.directory}: the layer does not match its digest {image.layer.digest}")
