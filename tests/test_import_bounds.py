"""What `gpuckpt import` writes before and while it checks an archive: the config first, nothing
staged before it, nothing past the operator's bounds (free space less a reserve, a cap, the
expansion of each entry), and nothing left of a refused import."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
import zstandard
from podman_tars import CONFIG, MANIFEST
from podman_tars import SPEC as PODMAN_SPEC

from gpuckpt.errors import ConfigError, ImageError
from gpuckpt.node.config import ImportConfig, parse_config
from gpuckpt.oci.archive import READ_BYTES, RatioGuard, decompressed
from gpuckpt.oci.podman_archive import copy_checked, described_dumps
from gpuckpt.policy.archive_import import import_refusals
from gpuckpt.transfer.bounds import StagingBudget, node_memory_bytes
from gpuckpt.transfer.staging import HeldOutput, Staging

SPEC = PODMAN_SPEC
PAGES = os.urandom(4096) * 16


class Zeros(io.RawIOBase):
    """`size` zero bytes, made as they are read."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count

    def readable(self) -> bool:
        return True


def tar_of(files: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def podman43_tar(pages: bytes | int = PAGES, config: bytes = CONFIG, devshm: bytes = b"\0" * 1536,
                 order: str = "podman", rootfs_diff: bytes = b"\0" * 10240, out=None) -> bytes:
    """A tar in podman 4.3's order (artifacts/, devshm-checkpoint.tar, config.dump, spec.dump, the
    small files, checkpoint/ sorted, rootfs-diff.tar), or with checkpoint/ first ("pages-first")
    or the GPU manifest after the pages ("manifest-last"); `pages` as bytes or a count of zeros,
    written to `out` if given."""
    top = [("artifacts/", None), ("devshm-checkpoint.tar", devshm), ("config.dump", config), ("spec.dump", SPEC),
           ("network.status", b"[]\n"), ("stats-dump", b"{}")]
    checkpoint = [("checkpoint/", None), ("checkpoint/gpuckpt-manifest.json", MANIFEST),
                  ("checkpoint/inventory.img", b"inv"), ("checkpoint/pages-1.img", pages)]
    if order == "manifest-last":
        checkpoint.append(checkpoint.pop(1))
    entries = checkpoint + top if order == "pages-first" else top + checkpoint
    target = out or io.BytesIO()
    with tarfile.open(fileobj=target, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [*entries, ("rootfs-diff.tar", rootfs_diff)]:
            info = tarfile.TarInfo(name.rstrip("/"))
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info.size = data if isinstance(data, int) else len(data)
            tar.addfile(info, Zeros(data) if isinstance(data, int) else io.BytesIO(data))
    return b"" if out else target.getvalue()


def zstd_of_zeros(size: int, **parts) -> bytes:
    """A podman archive, zstd, whose pages are `size` zero bytes (never all in memory)."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=1, threads=2).stream_writer(out, closefd=False) as compressed:
        podman43_tar(pages=size, out=compressed, **parts)
    return out.getvalue()


class Pass:
    """gpuckpt import's checking pass (cli/transfer.py run_import), parts as it puts them together."""

    def __init__(self, storage, limits: ImportConfig = ImportConfig(), trust_config: bool = False) -> None:
        storage.mkdir(exist_ok=True)
        self.storage, self.trust_config = storage, trust_config
        self.staging = Staging(str(storage), StagingBudget("a.tar.zst", str(storage), limits))
        self.held = HeldOutput(spill=self.staging.light)
        self.limits, self.seen_at_check = limits, None
        self.names: list[str] = []

    def config_read(self, kept: dict[str, bytes]) -> None:
        self.seen_at_check = list(self.names)
        dumps = described_dumps("a.tar.zst", kept)
        if not self.trust_config and (refusals := import_refusals(dumps)):
            raise ImageError(f"a.tar.zst: its container config asks for {'; '.join(refusals)}: refused")
        self.staging.start()  # whatever runtime the archive names: podman is given gpuckpt-runtime
        self.held.release(self.staging.light())

    def observe(self, member):
        self.names.append(member.name)

    def run(self, compressed: bytes):
        raw = io.BytesIO(compressed)
        try:
            copied = copy_checked(decompressed(raw), self.held, "a.tar.zst", kept={}, divert=self.staging.divert,
                                  trailer=(self.staging.placeholder(),), observe=self.observe,
                                  first=self.config_read,
                                  guard=RatioGuard("a.tar.zst", raw.tell, self.limits.max_entry_ratio, READ_BYTES,
                                                   len(compressed)))
            self.staging.close_light()
            return copied
        except BaseException:
            self.staging.remove()
            raise

    def staged(self) -> list[str]:
        return sorted(os.listdir(self.storage))


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(data)


def test_the_config_is_checked_before_any_entry_of_checkpoint(tmp_path) -> None:
    checking = Pass(tmp_path / "storage")
    copied = checking.run(zstd(podman43_tar()))
    # what the check had seen: podman's devshm before config.dump, held in memory, nothing staged yet
    assert checking.seen_at_check == ["artifacts", "devshm-checkpoint.tar", "config.dump", "spec.dump"]
    # the pages, /dev/shm and the root filesystem diff staged for the shim, never given to podman
    assert sorted(os.listdir(checking.staging.directory)) == ["archive.tar", "devshm-checkpoint.tar", "pages-1.img",
                                                              "rootfs-diff.tar"]
    with open(os.path.join(checking.staging.directory, "pages-1.img"), "rb") as staged:
        assert staged.read() == PAGES
    with tarfile.open(checking.staging.light_path) as light:
        assert not {"devshm-checkpoint.tar", "checkpoint/pages-1.img", "rootfs-diff.tar"} & set(light.getnames())
    assert "checkpoint/pages-1.img" in copied.names
    checking.staging.remove()
    assert checking.staged() == []


@pytest.mark.hostile("pages and CRIU images before config.dump and spec.dump")
def test_an_archive_with_its_pages_before_its_config_is_refused_with_nothing_staged(tmp_path) -> None:
    checking = Pass(tmp_path / "storage")
    with pytest.raises(ImageError) as refused:
        checking.run(zstd(podman43_tar(order="pages-first")))
    assert str(refused.value).startswith("a.tar.zst: checkpoint comes before config.dump and spec.dump: refused")
    assert "\n" not in str(refused.value) and checking.seen_at_check is None and checking.staged() == []


@pytest.mark.hostile("the GPU manifest after a pages image")
def test_a_gpu_manifest_after_the_pages_is_refused(tmp_path) -> None:
    checking = Pass(tmp_path / "storage")
    with pytest.raises(ImageError, match="gpuckpt-manifest.json comes after a pages image: refused"):
        checking.run(zstd(podman43_tar(order="manifest-last")))
    assert checking.staged() == []


@pytest.mark.hostile("a privileged container config ahead of its pages")
def test_a_refused_config_stages_nothing(tmp_path) -> None:
    privileged = json.dumps(json.loads(CONFIG) | {"privileged": True}).encode()
    checking = Pass(tmp_path / "storage")
    with pytest.raises(ImageError, match="a privileged container: refused"):
        checking.run(zstd(podman43_tar(config=privileged)))
    assert checking.names[-1] == "spec.dump" and checking.staged() == []  # stopped at the check


def test_dev_shm_before_the_config_is_staged_within_the_budget_and_removed_if_refused(tmp_path) -> None:
    """podman writes devshm-checkpoint.tar before config.dump: staged for the shim as it comes, taken from
    the budget, and gone with the rest when the config is refused."""
    devshm = tar_of([("big", bytes(2 << 20))])
    checking = Pass(tmp_path / "storage")
    checking.run(zstd(podman43_tar(devshm=devshm)))
    assert os.path.getsize(os.path.join(checking.staging.directory, "devshm-checkpoint.tar")) == len(devshm)
    checking.staging.remove()
    privileged = json.dumps(json.loads(CONFIG) | {"privileged": True}).encode()
    refused = Pass(tmp_path / "other")
    with pytest.raises(ImageError, match="a privileged container: refused"):
        refused.run(zstd(podman43_tar(devshm=devshm, config=privileged)))
    assert refused.staged() == []
    small = Pass(tmp_path / "small", ImportConfig(max_staged_bytes=1 << 20, reserve_bytes=0))
    with pytest.raises(ImageError, match=r"devshm-checkpoint.tar needs \d+ MiB of staging, more than this "
                                         r"import may still stage \(1 MiB"):
        small.run(zstd(podman43_tar(devshm=devshm)))
    assert small.staged() == []


@pytest.mark.hostile("a pages entry declaring more than the staging budget")
def test_a_pages_entry_larger_than_the_budget_is_refused_before_it_is_reserved(tmp_path) -> None:
    limits = ImportConfig(max_staged_bytes=len(PAGES) - 1, reserve_bytes=0)
    checking = Pass(tmp_path / "storage", limits)
    with pytest.raises(ImageError) as refused:
        checking.run(zstd(podman43_tar()))
    message = str(refused.value)
    assert message.startswith("a.tar.zst: checkpoint/pages-1.img needs 1 MiB of staging, more than this import may "
                              "still stage (0 MiB: import.max_staged_bytes 0 MiB") and "\n" not in message
    assert "import.reserve_bytes 0 MiB): refused" in message
    assert checking.staged() == []


def test_free_space_less_the_reserve_bounds_the_staging(tmp_path) -> None:
    status = os.statvfs(tmp_path)
    free = status.f_bavail * status.f_frsize
    budget = StagingBudget("a", str(tmp_path), ImportConfig(max_staged_bytes=1 << 60, reserve_bytes=free - 1000))
    assert 0 <= budget.left <= 1000  # others may have written since
    with pytest.raises(ImageError, match=f"free on {tmp_path} less import.reserve_bytes"):
        budget.take("checkpoint/pages-1.img", 1 << 20)
    auto = StagingBudget("a", str(tmp_path), ImportConfig(reserve_bytes=0))
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert "(auto: memory and swap)" in auto.why and auto.left <= node_memory_bytes() and node_memory_bytes() >= memory


@pytest.mark.hostile("a pages entry of 2 GiB of zeros in a 70 KiB zstd archive")
def test_an_entry_declaring_more_than_the_archive_could_hold_is_refused_at_its_header(tmp_path) -> None:
    bomb = zstd_of_zeros(2 << 30)
    assert len(bomb) < 128 << 10
    checking = Pass(tmp_path / "storage", ImportConfig(max_staged_bytes=1 << 40, reserve_bytes=0))
    with pytest.raises(ImageError) as refused:
        checking.run(bomb)
    assert str(refused.value) == ("a.tar.zst: checkpoint/pages-1.img declares 2048 MiB, which would expand more than "
                                  "4096 times its compressed size: refused (import.max_entry_ratio; memory that is "
                                  "almost all zeros compresses up to ~30000 times: raise it for such a checkpoint "
                                  "from a node you trust)")
    assert checking.staged() == []
    raised = Pass(tmp_path / "other", ImportConfig(max_entry_ratio=1 << 16, max_staged_bytes=1 << 30, reserve_bytes=0))
    with pytest.raises(ImageError, match="pages-1.img needs 2048 MiB of staging"):  # the operator raised the ratio
        raised.run(bomb)
    assert raised.staged() == []


@pytest.mark.hostile("2 GiB of zeros in one entry, followed by 1 MiB of noise that makes its size plausible")
def test_an_entry_expanding_past_the_ratio_is_refused_as_it_is_read(tmp_path) -> None:
    storage = tmp_path / "storage"
    bomb = zstd_of_zeros(2 << 30, rootfs_diff=os.urandom(1 << 20))
    checking = Pass(storage, ImportConfig(max_staged_bytes=1 << 40, reserve_bytes=0))
    largest = []
    divert = checking.staging.divert

    def watched(member):  # how much of the pages file is written
        stream = divert(member)
        if stream is None:
            return None
        write = stream.write
        stream.write = lambda data: (write(data), largest.append(stream.offset))[0]
        return stream

    checking.staging.divert = watched
    with pytest.raises(ImageError, match="checkpoint/pages-1.img expands more than 4096 times its compressed size"):
        checking.run(bomb)
    zeros_compressed = len(bomb) - (1 << 20)  # the noise after them does not compress
    assert 0 < max(largest) <= 4096 * (zeros_compressed + 2 * READ_BYTES) < 2 << 30 and checking.staged() == []


def test_the_ratio_guard_stops_within_its_bound() -> None:
    consumed = [0]
    guard = RatioGuard("a", lambda: consumed[0], 10, 100)
    guard.entry("x", 1 << 40)  # no total given: only what is read is bounded
    guard.moved(1000)  # 10 * (0 + 100): the read ahead of the entry
    with pytest.raises(ImageError, match="x expands more than 10 times"):
        guard.moved(1)
    guard.entry("y", 0)
    consumed[0] = 50
    guard.moved(1500)
    sized = RatioGuard("a", lambda: 0, 10, 100, total_bytes=900)
    sized.entry("z", 10_000)
    with pytest.raises(ImageError, match="z declares 0 MiB, which would expand more than 10 times"):
        sized.entry("z", 10_001)


def test_a_checkpoint_as_zero_as_a_measured_one_passes_the_default_ratio(tmp_path) -> None:
    """Measured on this machine: a podman checkpoint of a process holding 256 MiB of zeros and
    64 MiB with one byte set per page expanded 545 times (zstd 1) in its 338 MB pages-1.img: as
    much memory, as much noise (the interpreter's own) as compressed there."""
    pages = bytearray(64 << 20)
    pages[::4096] = b"\1" * (len(pages) // 4096)
    pages += bytes(256 << 20) + os.urandom(600 << 10)
    compressed = zstd(podman43_tar(pages=bytes(pages)))
    assert 400 < len(pages) / len(compressed) < 4096
    checking = Pass(tmp_path / "storage", ImportConfig(max_staged_bytes=1 << 40, reserve_bytes=0))
    checking.run(compressed)
    checking.staging.remove()


def test_held_output_keeps_what_comes_before_the_config_in_memory_up_to_its_bound() -> None:
    spilled = io.BytesIO()
    held = HeldOutput(spill=lambda: spilled, limit_bytes=10)
    held.write(b"12345")
    assert spilled.getvalue() == b""
    held.write(b"678901")
    assert spilled.getvalue() == b"12345678901"
    held.release(None)  # podman reads the archive itself: the rest is dropped
    held.write(b"x")
    assert spilled.getvalue() == b"12345678901"
    target = io.BytesIO()
    kept = HeldOutput(spill=lambda: pytest.fail("no spill"), limit_bytes=10)
    kept.write(b"abc")
    kept.release(target)
    kept.write(b"d")
    assert target.getvalue() == b"abcd"


def test_import_limits_in_the_config() -> None:
    config = parse_config('[import]\nmax_staged_bytes = 1000\nreserve_bytes = 0\nmax_entry_ratio = 4096\n', "c")
    assert config.import_ == ImportConfig(max_staged_bytes=1000, reserve_bytes=0, max_entry_ratio=4096)
    assert parse_config("", "c").import_ == ImportConfig(max_staged_bytes="auto", reserve_bytes=1 << 30,
                                                         max_entry_ratio=4096)
    with pytest.raises(ConfigError, match=r"unknown key 'import.max_ratio' \(allowed: max_staged_bytes, "):
        parse_config('[import]\nmax_ratio = 5\n', "c")
    with pytest.raises(ConfigError, match="import.max_entry_ratio = 0: should be a number >= 1"):
        parse_config('[import]\nmax_entry_ratio = 0\n', "c")
