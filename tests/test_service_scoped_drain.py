"""`gpuckpt drain CONTAINER...`: a drain of some recorded containers only (the operator trials of 2026-11-28 had
no way but a second gpuckptd with an inventory of its own and a record copied by hand). The words are resolved
by the CLI against gpuckptd's status (name, ID, or a unique ID prefix), an unknown one not found before anything
drains; the service drains those and every other member of a group one is in (a rank never moves alone).
podman is tests/fake_podman.py and gpuckpt its stand-in (test_group_service.Node), both run as programs."""

from __future__ import annotations

import pytest
from test_group_service import Node, service_node  # noqa: F401 -- the fixture

from gpuckpt.cli.drain import chosen_ids
from gpuckpt.errors import NotFoundError, UsageError
from gpuckpt.service.api import Request, Status
from gpuckpt.service.operations import drained


def test_a_drain_of_one_container_takes_it_alone(service_node: Node) -> None:  # noqa: F811 -- the fixture
    ids = service_node.ids
    events: list = []
    result = service_node.operations.drain(events.append, only=[ids["c"]])
    assert result.ok, result
    assert [call[:2] for call in service_node.gpuckpt_calls()] == [["export", ids["c"]]]
    assert {record.id for record in drained(service_node.config.archive_dir)} == {ids["c"]}
    assert [event.containers for event in events if getattr(event, "event", "") == "plan"] == [1]


def test_a_drain_of_one_rank_takes_its_whole_group(service_node: Node) -> None:  # noqa: F811 -- the fixture
    ids = service_node.ids
    result = service_node.operations.drain(lambda event: None, only=[ids["a"]])
    assert result.ok, result
    calls = service_node.gpuckpt_calls()
    assert calls == [["checkpoint", "--group", "job"]], calls  # b came along; c did not
    assert {record.id for record in drained(service_node.config.archive_dir)} == {ids["a"], ids["b"]}


def test_the_cli_resolves_names_ids_and_prefixes_against_what_is_recorded() -> None:
    web, db = "3f2a9c1b0d4e" + "1" * 52, "3f2b00000000" + "2" * 52
    status = Status(recorded=[web, db], drained=[], names={web: "web", db: "db"})
    assert chosen_ids(status, ["web", db, "3f2b"]) == [web, db]  # each once, in the order given
    with pytest.raises(NotFoundError, match=r"^cache: no recorded container of that name or ID \(gpuckpt service "
                                            r"status lists them"):
        chosen_ids(status, ["web", "cache"])
    with pytest.raises(UsageError, match=r"^3f2: the ID prefix of 2 recorded containers: give more of it"):
        chosen_ids(status, ["3f2"])


def test_a_request_names_containers_by_full_id_only() -> None:
    assert Request(op="drain", containers=["a" * 64]).containers == ["a" * 64]
    with pytest.raises(ValueError):
        Request(op="drain", containers=["web"])
