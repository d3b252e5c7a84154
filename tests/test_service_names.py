"""gpuckptd's views and log lines name containers as `podman ps` does, name and short ID, not IDs alone:
`gpuckpt service status` (text, and `names` in its JSON), the periodic checkpoint's line and the preemption
drain's "made it" line (issue 33's names item, met again in the operator trial of 2026-11-28). podman is
tests/fake_podman.py and gpuckpt its stand-in (test_group_service.Node), both run as programs."""

from __future__ import annotations

import threading
import time

from test_group_service import Node, service_node  # noqa: F401 -- the fixture

from gpuckpt.cli import drain as drain_cli
from gpuckpt.node.container_record import short_id
from gpuckpt.service.operations import drained, recorded
from gpuckpt.service.preemption import PreemptionWatch
from gpuckpt.service.schedule import Schedule


def test_status_names_recorded_and_drained_containers(service_node: Node) -> None:  # noqa: F811 -- the fixture
    ids = service_node.ids
    status = service_node.operations.status()
    assert status.names == {ids[name]: name for name in "abc"}
    shown = drain_cli._status_lines(status)
    assert f"recorded: 3 {', '.join(f'{name} ({short_id(ids[name])})' for name in 'abc')}" in shown, shown

    lone = next(record for record in recorded() if record.id == ids["c"])
    assert service_node.operations.drain(lambda event: None).ok
    assert any(record.id == lone.id for record in drained(service_node.config.archive_dir))
    shown = drain_cli._status_lines(service_node.operations.status())
    assert f"c ({short_id(ids['c'])})" in shown.splitlines()[-1] and shown.splitlines()[-1].startswith(
        "drained, waiting: 3 "), shown


def test_the_periodic_checkpoint_line_names_the_container(service_node: Node, capfd) -> None:  # noqa: F811
    schedule = Schedule(service_node.config, service_node.operations, utilization=dict)
    lone = [record for record in recorded() if record.id == service_node.ids["c"]]
    schedule._act([], lone, [], now=1000.0)
    logged = [line for line in capfd.readouterr().err.splitlines() if "periodic checkpoint" in line]
    assert len(logged) == 1 and f": podman container c ({short_id(service_node.ids['c'])})" in logged[0], logged


def test_the_preemption_line_names_what_made_it(service_node: Node, capfd) -> None:  # noqa: F811
    signalled = threading.Event()
    watch = PreemptionWatch(service_node.config, service_node.operations, signalled)
    signalled.set()
    deadline = time.monotonic() + 30
    while watch.view().state != "drained":
        assert time.monotonic() < deadline, watch.view()
        watch.check()
        time.sleep(0.05)
    logged = [line for line in capfd.readouterr().err.splitlines() if "made it:" in line]
    assert len(logged) == 1, logged
    made_it = logged[0].split("made it: ", 1)[1].split(";", 1)[0]
    assert made_it == ", ".join(f"{name} ({short_id(service_node.ids[name])})" for name in "abc"), logged[0]


def test_records_of_containers_the_engine_no_longer_has_are_found(service_node: Node) -> None:  # noqa: F811
    """The operator trial left four records of restored-then-removed containers where no gpuckptd ran, and
    doctor counted them as recorded: through_engine.removed names them (doctor's hook check warns of them)."""
    from gpuckpt.node.inventory import write_record
    from gpuckpt.service import through_engine

    gone_id = "d" * 64
    write_record({"version": 1, "id": gone_id, "engine": "podman", "bundle": "/b/d", "pid": 1, "gpus": [],
                  "created": "2026-11-28T05:00:00Z"})
    assert [record.id for record in through_engine.removed(recorded())] == [gone_id]
    service_node.dir.joinpath("podman").write_text("#!/bin/sh\nexit 125\n")  # podman failing: no verdict
    assert through_engine.removed(recorded()) == []


def test_the_removed_records_line_names_the_container(service_node: Node, capfd) -> None:  # noqa: F811
    """The trial of 2026-11-28b read "the container no longer exists: its record removed" with the ID only in
    the journal's CONTAINER_ID field (outside systemd: at the line's end, 64 hex): the line names it by engine
    and short ID, as `podman ps` would have (its name went with it)."""
    from gpuckpt.node.inventory import write_record

    gone_id = "e" * 64
    write_record({"version": 1, "id": gone_id, "engine": "podman", "bundle": "/b/e", "pid": 1, "gpus": [],
                  "created": "2026-11-28T05:00:00Z"})
    schedule = Schedule(service_node.config, service_node.operations, utilization=dict)
    assert schedule._drop_removed(recorded()) == {gone_id}
    logged = [line for line in capfd.readouterr().err.splitlines() if "no longer exists" in line]
    assert len(logged) == 1 and logged[0].startswith(
        f"gpuckptd: the container no longer exists: its record removed (podman container {short_id(gone_id)})"), logged
    assert gone_id not in [record.id for record in recorded()]
