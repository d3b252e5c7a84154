"""Shared fixtures of the unit tests: an isolated config and state directory."""

from __future__ import annotations

import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

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
