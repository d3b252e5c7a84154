"""Shared fixtures of the unit tests: an isolated config and state directory."""

from __future__ import annotations

import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuckpt.node.config import load_config
from gpuckpt.service import systemd
from gpuckpt.service.operations import Operations
from gpuckpt.service.preemption import PreemptionWatch
from gpuckpt.service.schedule import Schedule
from gpuckpt.service.server import Server
from gpuckpt.trust.keys import ensure_node_key


@pytest.fixture(autouse=True)
def no_leaked_criu_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shim points CRIU_CONFIG_FILE at its file in-process; undo that after each unit test,
    or the integration tests' real CRIU would inherit a unit test's file."""
    monkeypatch.setenv("CRIU_CONFIG_FILE", "")
    monkeypatch.delenv("CRIU_CONFIG_FILE")


@pytest.fixture(autouse=True)
def signal_handlers_put_back() -> Iterator[None]:
    """A command run in-process (cli.main) installs its SIGINT/SIGTERM/SIGHUP handlers for the process's life: put
    back after each test, or a later test sees another test's handler."""
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in kept.items():
        signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def own_trust_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every unit test signs and verifies with a node key of its own, never /etc/gpuckpt's."""
    trust = tmp_path_factory.mktemp("trust")
    monkeypatch.setenv("GPUCKPT_TRUST_DIR", str(trust / "etc"))
    monkeypatch.setenv("GPUCKPT_TRUST_LOG", str(trust / "trust.log"))
    ensure_node_key()


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private config path and state dir; the config file does not exist yet."""
    monkeypatch.setenv("GPUCKPT_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("GPUCKPT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUCKPT_JOURNAL_DIR", str(tmp_path / "journal"))
    thp = tmp_path / "thp-enabled"  # the node's own switch is never a unit test's to flip
    thp.write_text("always [madvise] never\n")
    monkeypatch.setenv("GPUCKPT_THP_ENABLED", str(thp))
    return tmp_path


@pytest.fixture
def recording_runtime(tmp_path: Path) -> Path:
    """An executable that records its argv, one per line, and exits with $REC_STATUS."""
    script = tmp_path / "bin" / "runc"
    script.parent.mkdir()
    script.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/argv"\nexit "${REC_STATUS:-0}"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


class ServedWatch:
    """gpuckptd's API and preemption watch, served in-process on NODE/api.sock; its notice file NODE/preempt."""

    def __init__(self, node: Path, extra: str) -> None:
        self.notice, self.signalled = node / "preempt", threading.Event()
        (node / "config.toml").write_text(f'[service]\nsocket = "{node / "api.sock"}"\n'
                                          f'archive_dir = "{node / "archive"}"\n'
                                          f'preemption_file = "{self.notice}"\n{extra}')
        config = load_config().service
        operations = Operations(config)
        self.watch = PreemptionWatch(config, operations, self.signalled)
        self.server = Server(config.socket, operations, self.watch, Schedule(config, operations), drains_on_stop=False)
        self.server.start()

    def drained(self) -> None:
        """Wait until the notice given has drained (nothing recorded: an empty drain) and the watch says so."""
        deadline = time.monotonic() + 10
        while self.watch.view().state != "drained":
            assert time.monotonic() < deadline, self.watch.view()
            self.watch.check()
            time.sleep(0.05)


@pytest.fixture
def served_watch(node: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ServedWatch]]:
    """A factory of ServedWatch (extra [service] lines as its argument), its log on stderr; closed after the test."""
    monkeypatch.setattr(systemd, "JOURNAL_SOCKET", "/nonexistent/journal-socket")
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    served: list[ServedWatch] = []

    def serve(extra: str = "") -> ServedWatch:
        served.append(ServedWatch(node, extra))
        return served[-1]

    yield serve
    for each in served:
        each.server.close()
