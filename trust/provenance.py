"""Signatures applied to what moves between nodes: exported archives and checkpoint images.

Export: each entry is hashed as the stream passes (`EntryDigests`, through copy_checked's
`observe` seam), then signed with the node key: for an archive, a detached `ARCHIVE.sig`
(entries plus the archive's own sha256); for an image, the manifest annotation
`io.gpuckpt.signature` (entries plus the layer digest and every other annotation), which a
registry and `skopeo copy` carry unchanged with the manifest.

Import: the envelope is verified first (a trusted key, or refused naming the key id), then
every entry against the signed list as it streams (`EntryCheck`), then the archive's own
digest (`HashingReader`) at its end; no unsigned input passes unless the trust policy has an
exception for its source, and that is logged.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..host.safefiles import create_new, read_bounded
from .keys import Trust, log_unsigned_use
from .signature import (
    MAX_ENVELOPE_BYTES,
    SignatureError,
    SignedContent,
    SignedEntry,
    Signer,
    open_envelope,
)

if TYPE_CHECKING:
    import tarfile

    from ..oci.archive import RawArchive
    from ..oci.image_layout import CheckpointImageWriter, ImageManifest
    from ..oci.podman_archive import ArchiveWriter
    from ..oci.tarstream import Data

SIGNATURE_SUFFIX = ".sig"
SIGNATURE_ANNOTATION = "io.gpuckpt.signature"


def signature_path(archive: str) -> str:
    return f"{archive}{SIGNATURE_SUFFIX}"


class BackgroundSha256:
    """sha256 taken on a thread of its own, in order: hashlib lets go of the GIL for large pieces,
    so hashing overlaps the decompression and staging instead of adding to them (3 GB of pages,
    16 CPUs: the import's pass 2.8 s unchecked, 7.1 s hashing inline, 5.1 s so; README). At most
    MAX_PENDING pieces wait; `hexdigest` waits for all."""

    MAX_PENDING = 4

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[None]] = deque()

    def update(self, data: bytes) -> None:
        if len(data) < 1 << 16:  # not worth a thread's round trip
            self._drain(0)
            self.hash.update(data)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="gpuckpt-sha256")
        self._pending.append(self._pool.submit(self.hash.update, data))
        self._drain(self.MAX_PENDING)

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            self._pending.popleft().result()

    def hexdigest(self) -> str:
        self._drain(0)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        return self.hash.hexdigest()


class _Digest:
    """One file entry's sha256, fed by copy_checked (`write`), never its padding; the piece is
    copied (copy_checked reuses its buffer) and hashed in the background."""

    def __init__(self) -> None:
        self.hash, self.size = BackgroundSha256(), 0

    def write(self, data: Data) -> None:
        self.hash.update(bytes(data))
        self.size += len(data)


def _entry(member: tarfile.TarInfo, digest: _Digest | None) -> SignedEntry:
    if member.isdir():
        return SignedEntry(name=member.name, type="dir", mode=member.mode & 0o777)
    return SignedEntry(name=member.name, mode=member.mode & 0o777, size=member.size,
                       sha256=digest.hash.hexdigest() if digest else None)


class EntryDigests:
    """Every entry as signed, taken while the export streams; `observe` is copy_checked's seam."""

    def __init__(self) -> None:
        self._done: list[SignedEntry] = []
        self._open: tuple[tarfile.TarInfo, _Digest] | None = None

    def observe(self, member: tarfile.TarInfo) -> _Digest | None:
        self._close()
        if member.isdir():
            self._done.append(_entry(member, None))
            return None
        self._open = (member, _Digest())
        return self._open[1]

    def _close(self) -> None:
        if self._open is not None:
            self._done.append(_entry(*self._open))
            self._open = None

    def entries(self) -> list[SignedEntry]:
        self._close()
        return list(self._done)


class _CheckedDigest(_Digest):
    """A file entry's data checked against its signed sha256 the moment the last byte arrives,
    before copy_checked passes that last chunk on (it shows the watcher each chunk first)."""

    def __init__(self, signed: SignedEntry, what: str) -> None:
        super().__init__()
        self.signed, self.what = signed, what
        if not signed.size:
            self._check()

    def write(self, data: Data) -> None:
        super().write(data)
        if self.size >= self.signed.size:
            self._check()

    def _check(self) -> None:
        if self.size != self.signed.size or self.hash.hexdigest() != self.signed.sha256:
            raise SignatureError(f"{self.what}: entry {self.signed.name!r} does not match its signed sha256 "
                                 f"({str(self.signed.sha256)[:16]}…): changed after signing: refused")


class EntryCheck:
    """Each entry checked against the signed list as it streams (copy_checked's `observe`): an
    entry not signed, or of another type, mode or size, fails before its data is read, and one
    whose data differs before its last chunk goes on; `finish` finds a signed entry missing."""

    def __init__(self, content: SignedContent, what: str) -> None:
        self.what = what
        self.signed = {entry.name: entry for entry in content.entries}
        self.seen: set[str] = set()

    def observe(self, member: tarfile.TarInfo) -> _CheckedDigest | None:
        signed = self.signed.get(member.name)
        if signed is None:
            raise SignatureError(f"{self.what}: entry {member.name!r} is not among the signed entries: refused")
        self.seen.add(member.name)
        found = _entry(member, None)
        for field in ("type", "mode", "size"):
            if getattr(found, field) != getattr(signed, field):
                raise SignatureError(f"{self.what}: entry {member.name!r} has {field} {getattr(found, field)!r}, "
                                     f"signed {getattr(signed, field)!r}: refused")
        return None if member.isdir() else _CheckedDigest(signed, self.what)

    def finish(self) -> None:
        missing = [name for name in self.signed if name not in self.seen]
        if missing:
            raise SignatureError(f"{self.what}: signed entr{'ies' if len(missing) > 1 else 'y'} "
                                 f"{', '.join(repr(name) for name in missing[:3])} missing: refused")


class HashingReader:
    """The raw archive as read once from the start (seeks back included), its sha256 taken on the way."""

    def __init__(self, raw: RawArchive) -> None:
        self.raw, self.hash, self.position, self.hashed_to = raw, BackgroundSha256(), 0, 0
        self.name: str = getattr(raw, "name", "archive")
        self.skipped = False

    def _saw(self, data: bytes) -> None:
        end = self.position + len(data)
        if self.position > self.hashed_to:
            self.skipped = True
        elif end > self.hashed_to:
            seen = self.hashed_to - self.position
            self.hash.update(data[seen:] if seen else data)
            self.hashed_to = end
        self.position = end

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self._saw(data)
        return data

    def fileno(self) -> int:
        return self.raw.fileno()

    def readinto(self, target: memoryview) -> int | None:
        count = self.raw.readinto(target)
        self._saw(bytes(memoryview(target)[:count]))  # the caller reuses its buffer
        return count

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.position = self.raw.seek(offset, whence)
        return self.position

    def tell(self) -> int:
        return self.position

    def readable(self) -> bool:
        return True

    def hexdigest(self) -> str | None:
        """The whole file's sha256 (what is left unread is read now); None if some was skipped."""
        while self.read(1 << 20):
            pass
        return None if self.skipped else self.hash.hexdigest()


class ArchiveVerification:
    """`gpuckpt import`'s check of one archive: `reader(raw)` and `observe` go into the one pass
    that stages it, `finish()` ends it; `again()` checks a later read of the same archive.
    Built by `verify_archive_signature`."""

    def __init__(self, content: SignedContent, what: str, signer_name: str) -> None:
        self.content, self.what, self.signer_name = content, what, signer_name
        self.entries = EntryCheck(content, what)
        self.observe = self.entries.observe
        self._reader: HashingReader | None = None

    def reader(self, raw: RawArchive) -> HashingReader:
        self._reader = HashingReader(raw)
        return self._reader

    def finish(self) -> None:
        self.entries.finish()
        digest = self._reader.hexdigest() if self._reader is not None else None
        if digest != self.content.archive_sha256:
            raise SignatureError(f"{self.what}: the archive's sha256 is {str(digest)[:16]}…, signed "
                                 f"{str(self.content.archive_sha256)[:16]}…: changed after signing: refused")



class Unsigned:
    """An unsigned archive the trust policy accepts (logged when made) for the file at the path it names:
    what is read must be that file (`identity`: device and inode), not one a swapped link names by then."""

    observe = None

    def __init__(self, identity: tuple[int, int] | None = None, archive: str = "") -> None:
        self.identity, self.archive = identity, archive

    def reader(self, raw: RawArchive) -> RawArchive:
        if self.identity is not None:
            status = os.fstat(raw.fileno())
            if (status.st_dev, status.st_ino) != self.identity:
                raise SignatureError(f"{self.archive}: not the file the trust policy allowed unsigned (its path "
                                     "names another since): refused")
        return raw

    def finish(self) -> None:
        pass


class LayerVerification:
    """`gpuckpt import oci:`'s check of a checkpoint image's one layer: what is read must hash to the
    digest its manifest names (and the manifest's signature covers: verify_image_signature)."""

    observe = None

    def __init__(self, digest: str, what: str) -> None:
        self.digest, self.what = digest, what
        self._reader: HashingReader | None = None

    def reader(self, raw: RawArchive) -> HashingReader:
        self._reader = HashingReader(raw)
        return self._reader

    def finish(self) -> None:
        digest = self._reader.hexdigest() if self._reader is not None else None
        if f"sha256:{digest}" != self.digest:
            raise SignatureError(f"{self.what}: its layer's sha256 is {str(digest)[:16]}…, the manifest names "
                                 f"{self.digest[7:23]}…: changed since: refused")


Verification = ArchiveVerification | Unsigned | LayerVerification  # what `gpuckpt import` reads through


def unsigned_refusal(what: str, source: str, why: str) -> SignatureError:
    return SignatureError(f"{what}: {why}: refused (sign it with `gpuckpt export` on a node this one trusts, or "
                          f"allow unsigned input from it: `gpuckpt trust allow-unsigned {source}`)")


def verify_archive_signature(archive: str, trust: Trust,
                             signature: str | None = None) -> ArchiveVerification | Unsigned:
    """The archive's signature checked before anything is read or staged: its checker, or
    `Unsigned` when there is none and the trust policy allows that for this archive (logged)."""
    sig_path = signature or signature_path(archive)
    resolved = os.path.realpath(archive)
    source = f"archive:{resolved}"
    if not os.path.lexists(sig_path):
        rule = trust.unsigned_rule(source)
        if rule is None:
            raise unsigned_refusal(archive, source, f"no signature ({sig_path})")
        try:
            allowed = os.stat(resolved)  # the file the rule was decided for (no link left in `resolved`)
        except OSError as error:
            raise SignatureError(f"{archive}: cannot read: {error.strerror}") from None
        log_unsigned_use(rule, archive)
        return Unsigned((allowed.st_dev, allowed.st_ino), archive)
    data = read_bounded(sig_path, MAX_ENVELOPE_BYTES, sig_path)
    content, signer = open_envelope(data, trust.keys, sig_path, "archive")
    if content.archive_sha256 is None:
        raise SignatureError(f"{sig_path}: an archive signature without the archive's sha256: refused")
    return ArchiveVerification(content, archive, signer.name)


def write_archive_signature(archive: str, archive_sha256: str, entries: list[SignedEntry], signer: Signer) -> str:
    """`ARCHIVE.sig` beside the archive (created new, 0644: it holds digests, no process data)."""
    path = signature_path(archive)
    envelope = signer.sign(signer.content("archive", entries, archive_sha256=archive_sha256))
    with os.fdopen(create_new(path, 0o644), "wb") as out:
        out.write(envelope)
    return path


class ExportSigning:
    """`gpuckpt export`'s signature: the node key is loaded before podman runs, entries are hashed
    as they stream (`observe`), and `finish` signs what was written."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self.digests = EntryDigests()
        self.observe = self.digests.observe

    def image_signature(self, layer_digest: str, annotations: dict[str, str]) -> dict[str, str]:
        """The image's signature annotation (oci.image_layout's writer calls it at finish)."""
        content = self.signer.content("image", self.digests.entries(), layer_digest=layer_digest,
                                      annotations=dict(annotations))
        return {SIGNATURE_ANNOTATION: self.signer.sign(content).decode()}

    def attach(self, writer: CheckpointImageWriter | ArchiveWriter) -> None:
        """An image writer signs its manifest at finish; an archive is signed by `finish` here."""
        if hasattr(writer, "sign"):
            writer.sign = self.image_signature

    def finish(self, writer: CheckpointImageWriter | ArchiveWriter) -> str:
        """The signature's place: ARCHIVE.sig, or the image manifest's annotation."""
        if hasattr(writer, "sign"):
            return f"{SIGNATURE_ANNOTATION} annotation"
        return write_archive_signature(writer.path, writer.sha256, self.digests.entries(), self.signer)


def verify_image_signature(manifest: ImageManifest, trust: Trust, what: str) -> tuple[SignedContent, str] | None:
    """A checkpoint image manifest's signature: content and signer name; None when unsigned and
    the policy allows unsigned restores; else a SignatureError. The layer digest and every other
    annotation must be exactly the signed ones."""
    annotations = dict(manifest.annotations or {})
    envelope = annotations.pop(SIGNATURE_ANNOTATION, None)
    if envelope is None:
        rule = trust.unsigned_rule("restore:any")
        if rule is None:
            raise unsigned_refusal(what, "restore:any", f"no {SIGNATURE_ANNOTATION} annotation")
        log_unsigned_use(rule, what)
        return None
    content, signer = open_envelope(envelope.encode(), trust.keys, f"{what} ({SIGNATURE_ANNOTATION})", "image")
    layer = manifest.layers[0].digest if len(manifest.layers) == 1 else None
    if content.layer_digest != layer:
        raise SignatureError(f"{what}: its layer is {layer}, signed {content.layer_digest}: refused")
    if content.annotations != annotations:
        changed = sorted(set(annotations.items()) ^ set((content.annotations or {}).items()))
        raise SignatureError(f"{what}: annotation {changed[0][0]!r} differs from the signed one: refused")
    return content, signer.name
