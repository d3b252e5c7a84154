"""gpuckptd's state an operator sees and steers, without an engine: the preemption watch as a state
machine driven by a real local HTTP notice source, a file and SIGUSR1's event (one notice, one drain;
a reset while no source still gives notice; later notices drain again), `gpuckptd --help`, and the
hint `gpuckpt drain` gives when the service is not running."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuckpt.cli.main import main as gpuckpt
from gpuckpt.node.config import ServiceConfig
from gpuckpt.service import systemd
from gpuckpt.service.operations import Operations
from gpuckpt.service.preemption import PreemptionWatch


class Metadata:
    """A metadata service on 127.0.0.1: every GET answers `body` (GCE's instance/preempted: TRUE or FALSE)."""

    def __init__(self) -> None:
        self.body = b"FALSE"
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                body = outer.body
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/computeMetadata/v1/instance/preempted"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metadata() -> Iterator[Metadata]:
    served = Metadata()
    yield served
    served.close()


@pytest.fixture
def quiet_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(systemd, "JOURNAL_SOCKET", "/nonexistent/journal-socket")  # stderr, as without systemd


def until(watch: PreemptionWatch, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Tick the watch as the service's loop does until `done`."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"still {watch.view()}"
        watch.check()
        time.sleep(0.05)


def test_a_notice_drains_once_is_shown_and_a_reset_watches_again(node: Path, metadata: Metadata, quiet_log) -> None:
    config = ServiceConfig(archive_dir=str(node / "archive"), preemption_url=metadata.url, preemption_poll_s=0.5,
                           preemption_file=str(node / "preempt"), preemption_deadline_s=120)
    signalled = threading.Event()
    watch = PreemptionWatch(config, Operations(config), signalled)
    assert watch.view().model_dump(include={"state", "sources"}) == {
        "state": "watching", "sources": [metadata.url, str(node / "preempt"), "SIGUSR1"]}
    watch.check()
    time.sleep(1.2)  # polled twice, FALSE: no notice
    watch.check()
    assert watch.view().state == "watching" and not watch.pending

    metadata.body = b"TRUE"
    noticed = time.time()
    until(watch, lambda: watch.view().state == "drained")
    view = watch.view()
    assert view.source.startswith(metadata.url) and watch.pending
    assert view.noticed_at is not None and view.deadline_at is not None
    deadline = time.mktime(time.strptime(view.deadline_at, "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(
        time.strptime(view.noticed_at, "%Y-%m-%dT%H:%M:%SZ"))
    assert 119 <= deadline <= 121  # preemption_deadline_s: GCE's notice names no time
    assert abs(time.mktime(time.strptime(view.noticed_at, "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(
        time.gmtime(noticed))) <= 3
    assert view.drain.startswith("drain: 0 done")  # nothing recorded: an empty drain, ended

    refused = watch.reset()  # the metadata service still says TRUE: a reset would drain again at once
    assert not refused.ok and f"{metadata.url} still gives notice" in refused.message
    assert watch.view().state == "drained"
    metadata.body = b"FALSE"
    time.sleep(1.2)
    cleared = watch.reset()
    assert cleared.ok and "watching again" in cleared.message, cleared
    assert "gpuckpt service restore" not in cleared.message  # its drain left nothing (the trial of 2026-11-28b)
    assert watch.view().state == "watching" and watch.view().source == "" and not watch.pending

    metadata.body = b"TRUE"  # a later notice is a preemption of its own, not ignored
    until(watch, lambda: watch.view().state == "drained")
    metadata.body = b"FALSE"
    time.sleep(1.2)
    assert watch.reset().ok

    (node / "preempt").touch()  # the file: a notice while it exists
    until(watch, lambda: watch.view().state == "drained")
    assert watch.view().source == f"{node / 'preempt'} exists"
    refused = watch.reset()
    assert not refused.ok and f"{node / 'preempt'} still exists (remove it)" in refused.message
    (node / "preempt").unlink()
    assert watch.reset().ok

    signalled.set()  # SIGUSR1: one notice, taken once
    until(watch, lambda: watch.view().state == "drained")
    assert watch.view().source == "SIGUSR1"
    signalled.set()  # a second signal while pending belongs to it, and a reset clears it
    assert watch.reset().ok
    watch.check()
    assert watch.view().state == "watching" and not signalled.is_set()
    assert watch.reset().message.startswith("no preemption to clear")


def test_gpuckptd_help_says_what_it_does() -> None:
    shown = subprocess.run([sys.executable, "-m", "gpuckpt.service.main", "--help"], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    for said in ("node service", "foreground", "--drain-on-stop", "SIGTERM", "SIGUSR1", "gpuckpt service reset"):
        assert said in " ".join(shown.stdout.split()), said  # argparse wraps its lines
    wrong = subprocess.run([sys.executable, "-m", "gpuckpt.service.main", "--drain"], capture_output=True, text=True,
                           timeout=60)
    assert wrong.returncode == 2 and "unrecognized arguments: --drain" in wrong.stderr


def test_drain_with_no_service_names_both_ways_to_start_it(node: Path, capsys) -> None:
    (node / "config.toml").write_text(f'[service]\nsocket = "{node / "gpuckptd.sock"}"\n')
    assert gpuckpt(["drain"]) == 1
    said = capsys.readouterr().err
    assert f"gpuckptd is not answering on {node / 'gpuckptd.sock'}" in said
    assert "`systemctl start gpuckptd`" in said and "`gpuckptd` in the foreground" in said, said
