"""An operator's drain or restore and gpuckptd's own background work (operator trial c, 2026-11-28): at a
0.5-minute interval `gpuckpt drain h33v-s1` was refused ("gpuckptd is busy: periodic checkpoint under way; try
again when it ends", exit status 1) three times in a row. The service's periodic checkpoints and record checks
are its own: a drain or restore asked meanwhile waits for the one under way; only another drain or restore
refuses it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpuckpt.node.config import ServiceConfig
from gpuckpt.service.api import Event, Result
from gpuckpt.service.operations import Operations


@pytest.fixture
def operations(node: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Operations:
    inventory = tmp_path / "inventory"  # nothing recorded: the drain and restore have nothing to move
    inventory.mkdir(mode=0o700)
    monkeypatch.setenv("GPUCKPT_INVENTORY_DIR", str(inventory))
    archive = tmp_path / "drain"
    archive.mkdir(mode=0o700)
    return Operations(ServiceConfig(archive_dir=str(archive)))


def _in_background(operations: Operations, name: str, hold: threading.Event, started: threading.Event,
                   call: str = "exclusive_call") -> threading.Thread:
    def held() -> None:
        started.set()
        assert hold.wait(10)

    def run() -> None:
        if call == "exclusive_call":
            operations.exclusive_call(name, held)
        else:  # an operator's operation, as the API runs one
            operations._exclusive(name, lambda _: None, lambda: (held(), Result(ok=True, message=""))[1])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    return thread


@pytest.mark.parametrize("background", ["periodic checkpoint", "record check"])
@pytest.mark.parametrize("operation", ["drain", "restore"])
def test_a_drain_or_restore_waits_for_the_services_own_work(operations: Operations, background: str,
                                                            operation: str) -> None:
    hold, started = threading.Event(), threading.Event()
    worker = _in_background(operations, background, hold, started)
    results: list[Event] = []
    asked = threading.Thread(target=lambda: getattr(operations, operation)(results.append), daemon=True)
    asked.start()
    asked.join(0.5)
    assert asked.is_alive(), f"the {operation} did not wait for the {background}: {results}"
    hold.set()
    asked.join(10)
    worker.join(10)
    assert not asked.is_alive()
    assert results and isinstance(results[-1], Result) and results[-1].ok, results
    assert "busy" not in results[-1].message


def test_a_drain_during_another_drain_is_still_refused(operations: Operations) -> None:
    hold, started = threading.Event(), threading.Event()
    worker = _in_background(operations, "drain", hold, started, call="_exclusive")
    results: list[Event] = []
    try:
        result = operations.drain(results.append)
    finally:
        hold.set()
        worker.join(10)
    assert not result.ok and result.message == "gpuckptd is busy: drain under way; try again when it ends"


def test_the_services_own_work_still_gives_way(operations: Operations) -> None:
    """A periodic checkpoint due while a drain runs is not taken then (the schedule tries again next time)."""
    hold, started = threading.Event(), threading.Event()
    worker = _in_background(operations, "drain", hold, started, call="_exclusive")
    try:
        with pytest.raises(Exception, match="gpuckptd is busy: drain under way"):
            operations.exclusive_call("periodic checkpoint", lambda: None)
    finally:
        hold.set()
        worker.join(10)
