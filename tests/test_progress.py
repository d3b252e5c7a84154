"""Progress of export, import, drain and restore (cli/progress.py): a bar with the total and the time
left on a terminal, through the verbs' own code; nothing on stderr in a script or under systemd."""

from __future__ import annotations

import fcntl
import os
import re
import socket
import struct
import tarfile
import termios
import threading
from pathlib import Path

import pytest
from podman_tars import CONFIG, MANIFEST, SPEC
from tqdm import tqdm

from gpuckpt.cli import drain, progress
from gpuckpt.cli.progress import SYSTEMD_VARIABLES
from gpuckpt.cli.transfer import checking_pass, exported
from gpuckpt.node.config import ImportConfig, ServiceConfig
from gpuckpt.oci.podman_archive import ArchiveWriter, described, described_dumps, exported_bytes
from gpuckpt.policy.archive_import import import_refusals
from gpuckpt.service.api import ContainerEvent, Plan, Result, parse_event
from gpuckpt.service.operations import Operations
from gpuckpt.transfer.bounds import StagingBudget
from gpuckpt.transfer.staging import HeldOutput, Staging
from gpuckpt.trust.provenance import Unsigned

TIME_LEFT = re.compile(r"\[\d\d:\d\d<\d\d:\d\d, ")  # tqdm's [elapsed<remaining, rate]: only with a total
PAGES = os.urandom(1 << 20) + bytes(2 << 20)  # compressed, about a third: the archive is smaller than its tar


class Terminal:
    """A pseudo-terminal of 120 columns standing in for stderr, read as it is written."""

    def __init__(self) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
        self.stream = os.fdopen(slave, "w", buffering=1, encoding="utf-8")
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the other side closed
                return
            if not chunk:
                return
            self.chunks.append(chunk)

    def text(self) -> str:
        """All that was written, once the terminal is closed."""
        if not self.stream.closed:
            self.stream.close()
            self.reader.join(10)
            os.close(self.master)
        return b"".join(self.chunks).decode()


@pytest.fixture
def outside_systemd(monkeypatch) -> None:
    for name in SYSTEMD_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def terminal(outside_systemd):
    """A Terminal, which a test makes its stderr (pytest's capture sets sys.stderr for each phase)."""
    term = Terminal()
    yield term
    term.text()


@pytest.fixture
def not_a_terminal(outside_systemd, tmp_path):
    with open(tmp_path / "stderr", "w+") as stream:
        yield stream


def sized(count: int) -> str:
    return tqdm.format_sizeof(count, "iB", 1024)


def podman_bundle(bundle: Path) -> None:
    """What podman has in a container's bundle when it opens the export's target: the files it
    exports and some it does not."""
    (bundle / "artifacts").mkdir(parents=True)
    (bundle / "checkpoint").mkdir()
    for name, data in [("devshm-checkpoint.tar", bytes(1536)), ("config.dump", CONFIG), ("spec.dump", SPEC),
                       ("network.status", b"[]\n"), ("stats-dump", b"{}"),
                       ("checkpoint/gpuckpt-manifest.json", MANIFEST), ("checkpoint/inventory.img", b"inv"),
                       ("checkpoint/pages-1.img", PAGES), ("rootfs-diff.tar", bytes(10240)),
                       ("config.json", b"{}" * 500), ("attach", b""), ("oci-log", b"x" * 4096)]:  # last 3: not exported
        (bundle / name).write_bytes(data)
    (bundle / "checkpoint" / "elsewhere").symlink_to(bundle / "oci-log")  # not followed


def podman_export(bundle: Path, target: Path) -> None:
    """The tar podman's export writes of `bundle`, in podman 4.3's order."""
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("artifacts", "devshm-checkpoint.tar", "config.dump", "spec.dump", "network.status",
                     "stats-dump", "checkpoint/gpuckpt-manifest.json", "checkpoint/inventory.img",
                     "checkpoint/pages-1.img", "rootfs-diff.tar"):
            tar.add(bundle / name, arcname=name, recursive=False)


def export_into(tmp_path: Path, archive: Path) -> int:
    """`gpuckpt export`'s copy of podman's stream (cli/transfer.exported) into `archive`; its bytes."""
    bundle, stream = tmp_path / "userdata", tmp_path / "podman-export.tar"
    podman_bundle(bundle)
    podman_export(bundle, stream)
    writer, kept = ArchiveWriter(str(archive)), dict[str, bytes]()
    with open(stream, "rb", buffering=0) as source:
        copied = exported(source, writer, "web", str(bundle), kept=kept, observe=None)
    writer.finish(described(str(archive), kept, copied.names, copied.files, copied.bytes))
    assert copied.bytes == exported_bytes(str(bundle))  # the bar's total is what the copy counts
    return copied.bytes


def import_pass(tmp_path: Path, archive: Path) -> None:
    """`gpuckpt import`'s checking pass (cli/transfer.checking_pass) over `archive`."""
    storage = tmp_path / "storage"
    storage.mkdir()
    staging = Staging(str(storage), StagingBudget(str(archive), str(storage), ImportConfig()))
    held = HeldOutput(spill=staging.light)

    def config_read(kept: dict[str, bytes]) -> None:
        assert import_refusals(described_dumps(str(archive), kept)) == []
        held.release(staging.light())

    try:
        copied, _ = checking_pass(str(archive), Unsigned(), held, staging, limits=ImportConfig(),
                                     config_read=config_read)
        staging.close_light()
        assert "checkpoint/pages-1.img" in copied.names
    finally:
        staging.remove()


def test_export_on_a_terminal_shows_the_bytes_of_podmans_files_and_the_time_left(tmp_path, terminal,
                                                                                 monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr", terminal.stream)
    moved = export_into(tmp_path, tmp_path / "web.tar.zst")
    shown = terminal.text()
    assert moved > len(PAGES)
    assert "exporting web: 100%" in shown and f"{sized(moved)}/{sized(moved)}" in shown, shown
    assert TIME_LEFT.search(shown), shown


def test_import_on_a_terminal_counts_the_archives_own_bytes_with_the_time_left(tmp_path, terminal,
                                                                               monkeypatch) -> None:
    archive = tmp_path / "web.tar.zst"
    export_into(tmp_path, archive)  # quiet: pytest's stderr is no terminal
    monkeypatch.setattr("sys.stderr", terminal.stream)
    monkeypatch.setattr(progress, "REDRAW_S", 0)  # every step drawn
    import_pass(tmp_path, archive)
    shown = terminal.text()
    size = archive.stat().st_size  # compressed: what is read, not the larger tar inside
    assert size < len(PAGES) / 2
    assert "importing web.tar.zst: 100%" in shown and f"{sized(size)}/{sized(size)}" in shown, shown
    assert TIME_LEFT.search(shown), shown
    drawn = [int(percent) for percent in re.findall(r"importing web.tar.zst: +(\d+)%", shown)]
    assert len(set(drawn)) > 2 and max(drawn) == 100, shown  # steps on the way, never past the total


def test_export_and_import_write_nothing_to_stderr_that_is_no_terminal(tmp_path, not_a_terminal,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr", not_a_terminal)
    archive = tmp_path / "web.tar.zst"
    export_into(tmp_path, archive)
    import_pass(tmp_path, archive)
    not_a_terminal.seek(0)
    assert not_a_terminal.read() == ""  # an engine or a script calling us hears nothing


@pytest.mark.parametrize("variable, value", [("INVOCATION_ID", "0b3c1e5f8d2a4c6e9f1a2b3c4d5e6f70"),
                                             ("JOURNAL_STREAM", "8:12345")])
def test_under_systemd_a_terminal_gets_no_bar(tmp_path, terminal, monkeypatch, variable, value) -> None:
    monkeypatch.setattr("sys.stderr", terminal.stream)
    monkeypatch.setenv(variable, value)
    archive = tmp_path / "web.tar.zst"
    export_into(tmp_path, archive)
    import_pass(tmp_path, archive)
    assert drain.report(restore_events(), as_json=False)
    assert terminal.text() == ""


def restore_events(plan: bool = True) -> list:
    """What gpuckptd sends for a restore of three containers, as the CLI parses it."""
    sent = [Plan(phase="restore", containers=3, bytes=3 << 30)] if plan else []
    for number in range(3):
        started = ContainerEvent(id=f"c{number}" * 20, engine="podman", phase="restore", state="started")
        sent += [started, started.model_copy(update={"state": "done", "bytes": 1 << 30, "seconds": 2.0})]
    sent.append(Result(ok=True, message="restore: 3 done, 0 failed, 0 skipped in 6.0 s", done=["c0", "c1", "c2"]))
    return [parse_event(event.model_dump_json().encode()) for event in sent]


def test_restore_on_a_terminal_keeps_a_line_per_container_and_shows_a_bar_over_them(terminal, capsys,
                                                                                    monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr", terminal.stream)
    events = restore_events()
    assert drain.report(events, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "restore 3 containers (3072.0 MiB of checkpoints)"
    assert lines[1:-1] == [drain._line(event) for event in events[1:-1]]
    assert lines[1].startswith("restore started c0c0c0c0c0c0 (podman)") and "(1024.0 MiB, 2.0 s)" in lines[2]
    assert lines[-1] == "restore: 3 done, 0 failed, 0 skipped in 6.0 s"
    shown = terminal.text()
    assert "restore: 100%" in shown and "3/3" in shown and "3.00GiB of 3.00GiB" in shown, shown
    assert TIME_LEFT.search(shown), shown


def test_json_output_is_the_services_events_with_the_bar_on_stderr(terminal, capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr", terminal.stream)
    events = restore_events()
    assert drain.report(events, as_json=True)
    assert capsys.readouterr().out.splitlines() == [event.model_dump_json() for event in events]
    assert "3/3" in terminal.text()


def test_an_older_service_without_a_plan_gets_a_count_without_time_left(terminal, capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr", terminal.stream)
    events = restore_events(plan=False)
    assert drain.report(events, as_json=False)
    assert len(capsys.readouterr().out.splitlines()) == len(events)
    shown = terminal.text()
    assert "restore: 3 containers" in shown and "3.00GiB" in shown, shown
    assert not TIME_LEFT.search(shown), shown


def test_drain_output_in_a_script_has_no_bar(not_a_terminal, capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr", not_a_terminal)
    failed = [*restore_events()[:-2], parse_event(ContainerEvent(id="c2" * 20, engine="podman", phase="restore",
                                                                 state="failed", message="no").model_dump_json())]
    assert not drain.report(failed, as_json=False)
    assert capsys.readouterr().out.splitlines()[-1] == "restore failed  c2c2c2c2c2c2 (podman): no"
    not_a_terminal.seek(0)
    assert not_a_terminal.read() == ""


def test_a_restore_tells_its_plan_first_and_systemd_its_progress(tmp_path, monkeypatch) -> None:
    archive_dir = tmp_path / "drain"
    archive_dir.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify"))
    listener.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    heard: list = []
    result = Operations(ServiceConfig(archive_dir=str(archive_dir))).restore(heard.append)
    assert result.ok and heard == [Plan(phase="restore", containers=0, bytes=0), result]
    assert listener.recv(4096) == b"STATUS=restore: 0 of 0 restored, 0.0 of 0.0 GiB"
    listener.close()
