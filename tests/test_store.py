"""The checkpoint store with real files: chunking, dedup, the stream given back, integrity, bad input."""

from __future__ import annotations

import io
import os
import random
import stat
import tarfile

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from podman_tars import CONFIG, SPEC, podman_tar

from gpuckpt.errors import ImageError, UsageError
from gpuckpt.oci.podman_archive import copy_checked, described
from gpuckpt.store import chunking
from gpuckpt.store.catalog import usage
from gpuckpt.store.chunking import MAX_CHUNK_BYTES, FileChunker, chunk_digest
from gpuckpt.store.reader import StoredStream, missing_chunks, verify_chunks
from gpuckpt.store.repository import ChunkError, Store, _advanced, raw_frame
from gpuckpt.store.writer import CheckpointWriter

CONTAINER_ID = "c0ffee" * 10 + "abcd"
SAMPLE_DATA = random.Random(11).randbytes(20 << 20)


def random_bytes(count: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(count)


def cut(data: bytes, piece: int) -> list[bytes]:
    chunks: list[bytes] = []
    chunker = FileChunker(lambda chunk: chunks.append(bytes(chunk)))
    for at in range(0, len(data), piece):
        chunker.write(data[at:at + piece])
    chunker.close()
    return chunks


def test_streamed_cuts_equal_one_pass_whatever_the_pieces() -> None:
    data = random_bytes(40 << 20, 1)
    whole = [bytes(piece.data) for piece in chunking.chunker().cut_buf(data)]
    assert b"".join(whole) == data and len(whole) > 50
    for piece in (4096, 1 << 20, 3_333_333, 4 << 20):
        assert cut(data, piece) == whole
    assert all(len(chunk) <= MAX_CHUNK_BYTES for chunk in whole)


def test_an_insertion_moves_only_the_chunks_around_it() -> None:
    data = random_bytes(16 << 20, 2)
    moved = data[:5_000_000] + b"inserted" * 1000 + data[5_000_000:]
    before, after = set(cut(data, 1 << 20)), cut(moved, 1 << 20)
    new = sum(len(chunk) for chunk in after if chunk not in before)
    assert new < 3 * MAX_CHUNK_BYTES  # content-defined: the rest cuts at the same places


def put(store: Store, tar: bytes, name: str) -> tuple:
    writer = CheckpointWriter(store, threads=3)
    kept: dict[str, bytes] = {}
    with store.locked():
        copied = copy_checked(io.BytesIO(tar), None, name, kept=kept, observe=writer.observe)
        archive = described(name, kept, copied.names, copied.files, copied.bytes)
        return writer.commit(name, archive.config.name, archive.config.id), copied


def reassembled(store: Store, name: str) -> bytes:
    out = io.BytesIO()
    copy_checked(StoredStream(store, store.read_checkpoint(name), threads=2), out, name)
    return out.getvalue()


def reemitted(tar: bytes) -> bytes:
    """What gpuckpt export's checked copy writes of `tar`: the same entries with fresh headers."""
    out = io.BytesIO()
    copy_checked(io.BytesIO(tar), out, "original")
    return out.getvalue()


def pages_tar(pages: bytes) -> bytes:
    return podman_tar([("checkpoint/pages-2.img", pages)])


@pytest.fixture
def store(tmp_path) -> Store:
    with Store(str(tmp_path / "store")) as opened:
        yield opened


def test_checkpoint_comes_back_as_the_stream_export_writes(store) -> None:
    tar = pages_tar(random_bytes(6 << 20, 3) + bytes(3 << 20))
    stored, copied = put(store, tar, "web-1")
    assert stored.logical_bytes == copied.bytes and stored.container == "web" and stored.container_id == CONTAINER_ID
    assert reassembled(store, "web-1") == reemitted(tar)
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    names = [entry.name for entry in stored.entries]
    assert names.index("config.dump") < names.index("checkpoint/pages-2.img")  # the export's order kept


def test_second_checkpoint_stores_only_what_changed(store) -> None:
    pages = bytearray(random_bytes(32 << 20, 4))
    first, _ = put(store, pages_tar(bytes(pages)), "web-1")
    rng = random.Random(5)
    for _ in range(3):  # about 10 % of the pages rewritten, in 1 MiB stretches here and there
        at = rng.randrange(0, len(pages) - (1 << 20)) // 4096 * 4096
        pages[at:at + (1 << 20)] = rng.randbytes(1 << 20)
    changed = pages_tar(bytes(pages))
    second, _ = put(store, changed, "web-2")
    assert first.new_bytes >= 32 << 20
    assert second.new_bytes / first.new_bytes < 0.2
    assert reassembled(store, "web-2") == reemitted(changed)
    shown = {row.name: row for row in usage(store).checkpoints}
    assert shown["web-2"].shared_bytes > 0.7 * second.logical_bytes
    assert shown["web-2"].shared_bytes + shown["web-2"].unique_bytes <= second.logical_bytes


def test_identical_chunks_are_written_once(store) -> None:
    stored, _ = put(store, pages_tar(bytes(8 << 20)), "zeros")  # zeroed memory: one max-size chunk, repeated
    files = list(store.chunk_files())
    assert len(files) < 10 and stored.new_bytes < 2 * MAX_CHUNK_BYTES
    assert sum(status.st_size for _, status in files) < 64 << 10  # and compressed


def corrupt(store: Store, digest: str, size: int, how: str) -> None:
    path = os.path.join(store.root, store.chunk_name(digest))
    if how == "missing":
        os.unlink(path)
    elif how == "flipped":
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 1
        open(path, "wb").write(data)
    elif how == "other-chunk":  # a valid zstd frame of other bytes of the same size
        with open(path, "wb") as out:
            out.write(zstandard.ZstdCompressor().compress(bytes(size)))
    elif how == "symlink":
        os.unlink(path)
        os.symlink("/etc/passwd", path)


@pytest.mark.hostile("a store chunk missing, with a flipped byte, another valid frame of its size, or a link")
@pytest.mark.parametrize("how", ["missing", "flipped", "other-chunk", "symlink"])
def test_a_bad_chunk_is_named_before_anything_is_given_back(store, how) -> None:
    stored, _ = put(store, pages_tar(random_bytes(4 << 20, 6)), "web-1")
    pages = next(entry for entry in stored.entries if entry.name == "checkpoint/pages-2.img")
    digest, size = pages.chunks[len(pages.chunks) // 2]
    corrupt(store, digest, size, how)
    with pytest.raises(ChunkError) as error:
        reassembled(store, "web-1")
    message = str(error.value)
    assert digest in message and "checkpoint/pages-2.img" in message and "\n" not in message
    assert verify_chunks(store, stored.digests()).keys() == {digest}
    assert missing_chunks(store, stored) == ([digest] if how in ("missing", "symlink") else [])


@pytest.mark.hostile("a store manifest naming a path as a chunk, another checkpoint, an entry outside, a terminal "
                     "escape, or a link")
def test_store_refuses_what_it_did_not_make(store, tmp_path) -> None:
    put(store, pages_tar(random_bytes(1 << 20, 7)), "web-1")
    path = os.path.join(store.root, "checkpoints", "web-1.json")
    text = open(path).read()
    digest = store.read_checkpoint("web-1").entries[-1].chunks[0][0]
    for bad, why in ((text.replace(digest, "../../../../etc/passwd" + "0" * 42), "chunks"),
                     (text.replace('"name":"web-1"', '"name":"web-2"'), "names itself"),
                     (text.replace('"name":"config.dump"', '"name":"../config.dump"'), "relative"),
                     (text.replace('"container":"web"', '"container":"web\\u001b]0;owned\\u0007"'), "container")):
        open(path, "w").write(bad)
        with pytest.raises(ImageError) as error:
            store.read_checkpoint("web-1")
        assert why in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(UsageError, match="letters, digits"):
        store.read_checkpoint("../web-1")
    with pytest.raises(ImageError, match="not a BLAKE3 digest"):
        store.read_chunk("../" * 20 + "x" * 4, 1)
    os.unlink(path)
    os.symlink("/etc/passwd", path)
    with pytest.raises(ImageError, match="cannot read"):
        store.read_checkpoint("web-1")


def test_a_store_others_may_write_is_refused(tmp_path) -> None:
    root = tmp_path / "open"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    with pytest.raises(Exception, match="alone may write"):
        Store(str(root))


def test_names_are_not_reused(store) -> None:
    tar = pages_tar(random_bytes(1 << 20, 8))
    put(store, tar, "web-1")
    with pytest.raises(UsageError, match="already in"):
        put(store, tar, "web-1")
    assert store.checkpoint_names() == ["web-1"]


def test_an_entry_stream_with_a_directory_and_empty_file(store) -> None:
    tar = podman_tar([("checkpoint/empty.img", b"")], config=CONFIG, spec=SPEC)
    put(store, tar, "small")
    with tarfile.open(fileobj=io.BytesIO(reassembled(store, "small"))) as back:
        assert back.getmember("checkpoint").isdir() and back.getmember("checkpoint/empty.img").size == 0


def test_chunk_digest_is_blake3_hex() -> None:
    assert chunk_digest(b"abc") == "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"


def test_incompressible_chunks_are_stored_as_raw_zstd_frames(store) -> None:
    random_chunk, zero_chunk = random_bytes(300_001, 9), bytes(300_001)
    for data in (random_chunk, zero_chunk):
        digest = chunk_digest(data)
        written = store.put_chunk(digest, memoryview(data))
        on_disk = open(os.path.join(store.root, store.chunk_name(digest)), "rb").read()
        assert len(on_disk) == written and zstandard.get_frame_parameters(on_disk).content_size == len(data)
        assert store.read_chunk(digest, len(data)) == data
    assert store.put_chunk(chunk_digest(random_chunk), memoryview(random_chunk)) < len(random_chunk) + 64
    assert store.put_chunk(chunk_digest(zero_chunk), memoryview(zero_chunk)) < 1000


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3 << 20), min_size=1, max_size=12))
def test_cuts_do_not_depend_on_how_the_bytes_arrive(pieces) -> None:
    data = SAMPLE_DATA[:sum(pieces)] if sum(pieces) < len(SAMPLE_DATA) else SAMPLE_DATA
    whole = [bytes(piece.data) for piece in chunking.chunker().cut_buf(data)]
    chunks: list[bytes] = []
    chunker = FileChunker(lambda chunk: chunks.append(bytes(chunk)))
    at = 0
    for size in pieces:
        chunker.write(data[at:at + size])
        at += size
    chunker.write(data[at:])
    chunker.close()
    assert chunks == whole


@pytest.mark.parametrize("written", [0, 1, 12, 13, 14, 13 + 3 + 131072, 13 + 3 + 131072 + 3 + 5])
def test_a_short_writev_goes_on_where_it_stopped(written) -> None:
    data = memoryview(random_bytes(131072 + 5, 10))
    pieces = raw_frame(data)
    whole = b"".join(bytes(piece) for piece in pieces)
    assert b"".join(bytes(piece) for piece in _advanced(pieces, written)) == whole[written:]
    assert zstandard.ZstdDecompressor().decompress(whole, max_output_size=len(data)) == data
