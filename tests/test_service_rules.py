"""gpuckptd's rules that need no engine: cloud notices, retention, intervals, the record's options."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuckpt.hooks.main import options
from gpuckpt.node.config import ServiceConfig
from gpuckpt.node.container_record import ContainerRecord
from gpuckpt.node.inventory import InventoryError, check_container_id
from gpuckpt.service.cloud_notices import parse_notice
from gpuckpt.service.schedule import checkpoint_interval_s, prune, prune_to_budget

NOW = datetime(2026, 11, 25, 5, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("status", "body", "deadline"), [
    (200, b"TRUE", None),  # GCE instance/preempted
    (200, b"FALSE", "none"),
    (404, b"", "none"),  # AWS before a notice
    (200, json.dumps({"action": "terminate", "time": "2026-11-25T05:01:30Z"}).encode(), 90.0),
    (200, json.dumps({"action": "stop", "time": "2026-11-25T04:59:00Z"}).encode(), 0.0),  # already past
    (200, json.dumps({"DocumentIncarnation": 2, "Events": [
        {"EventId": "x", "EventType": "Freeze", "NotBefore": "Wed, 25 Nov 2026 05:00:10 GMT"},
        {"EventId": "y", "EventType": "Preempt", "NotBefore": "Wed, 25 Nov 2026 05:00:30 GMT"}]}).encode(), 30.0),
    (200, json.dumps({"DocumentIncarnation": 1, "Events": []}).encode(), "none"),
    (200, json.dumps({"DocumentIncarnation": 1, "Events": [{"EventType": "Freeze"}]}).encode(), "none"),
    (200, b"<html>captive portal</html>", "none"),
    (200, b"TRUE" + b" " * (64 << 10), "none"),  # over the bound
])
def test_cloud_notices(status, body, deadline) -> None:
    notice = parse_notice(status, body, NOW)
    if deadline == "none":
        assert notice is None
    else:
        assert notice is not None and notice.deadline_s == deadline


def record(**annotations: str) -> ContainerRecord:
    return ContainerRecord(version=1, id="c1", engine="podman", bundle="/b", pid=1, gpus=[],
                           created="2026-11-25T05:00:00Z", options=options(annotations))


def test_interval_from_annotation_never_below_the_operators_floor() -> None:
    config = ServiceConfig(checkpoint_min_interval_min=5)
    assert checkpoint_interval_s(record(**{"io.gpuckpt.checkpoint-every": "1"}), config) == 300
    assert checkpoint_interval_s(record(**{"io.gpuckpt.checkpoint-every": "60"}), config) == 3600
    assert checkpoint_interval_s(record(), config) is None
    assert checkpoint_interval_s(record(), ServiceConfig(checkpoint_every_min=30)) == 1800
    for bad in ("-5", "1e9", "five", "0", "", "\u00b2", "\u0663", "1" * 7):  # "²" passes str.isdigit()
        assert checkpoint_interval_s(record(**{"io.gpuckpt.checkpoint-every": bad}), config) is None


def test_record_keeps_only_bounded_gpuckpt_annotations() -> None:
    annotations = {"io.gpuckpt.a": "1", "org.other": "x", "io.gpuckpt.long": "v" * 257,
                   **{f"io.gpuckpt.k{i:02}": str(i) for i in range(30)}}
    kept = options(annotations)
    assert len(kept) == 16 and "org.other" not in kept and "io.gpuckpt.long" not in kept
    # JSON escapes U+10FFFF to 12 bytes: 16 such options would outgrow the record's bound
    assert options({"io.gpuckpt.a": "\U0010ffff" * 256, "io.gpuckpt.\U0010ffff": "1", "io.gpuckpt.b": "x\ny"}) == {}


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for stamp in ("20261125T010000Z", "20261125T020000Z", "20261125T030000Z"):
        (tmp_path / f"{stamp}.tar.zst").write_bytes(b"x")
        (tmp_path / f"{stamp}.tar.zst.sig").write_bytes(b"s")
    (tmp_path / "20261125T000000Z").mkdir()  # docker's checkpoint directories
    gone = prune(str(tmp_path), 2)
    assert gone == ["20261125T000000Z", "20261125T010000Z"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "20261125T020000Z.tar.zst", "20261125T020000Z.tar.zst.sig", "20261125T030000Z.tar.zst",
        "20261125T030000Z.tar.zst.sig"]


def test_deadline_in_the_past_is_zero_not_negative() -> None:
    late = {"action": "terminate", "time": (NOW - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    notice = parse_notice(200, json.dumps(late).encode(), NOW)
    assert notice is not None and notice.deadline_s == 0.0


@pytest.mark.hostile("a metadata answer with a time without zone, a date that is none, JSON nested 60000 deep")
@pytest.mark.parametrize(("body", "deadline"), [
    (json.dumps({"action": "terminate", "time": "2026-11-25T05:01:00"}).encode(), 60.0),  # read as UTC
    (json.dumps({"Events": [{"EventType": "Preempt", "NotBefore": "not a date"}]}).encode(), None),
    (b"[" * 60000, "none"),
])
def test_odd_metadata_answers_are_notices_or_nothing_never_errors(body, deadline) -> None:
    notice = parse_notice(200, body, NOW)
    if deadline == "none":
        assert notice is None
    else:
        assert notice is not None and notice.deadline_s == deadline


def test_an_id_beginning_with_a_dash_is_no_container_id() -> None:
    with pytest.raises(InventoryError, match="not allowed"):
        check_container_id("-l")


def test_an_azure_event_for_other_vms_only_is_not_this_vms_notice() -> None:
    def events(*resources: str) -> bytes:
        return json.dumps({"DocumentIncarnation": 3, "Events": [
            {"EventId": "x", "EventType": "Preempt", "Resources": list(resources),
             "NotBefore": "Wed, 25 Nov 2026 05:00:30 GMT"}]}).encode()
    assert parse_notice(200, events("vm-b", "vm-c"), NOW, vm_name="vm-a") is None
    assert parse_notice(200, events("vm-b", "vm-a"), NOW, vm_name="vm-a") is not None
    assert parse_notice(200, events("VM-A"), NOW, vm_name="vm-a") is not None  # Azure's names ignore case
    # this VM's name unknown, or an event naming no VM: a drain rather than a missed notice
    assert parse_notice(200, events("vm-b"), NOW) is not None
    assert parse_notice(200, events(), NOW, vm_name="vm-a") is not None


def test_the_budget_takes_the_oldest_first_and_never_a_recorded_containers_newest(tmp_path: Path) -> None:
    root = tmp_path / "periodic"
    mib = 1 << 20

    def checkpoint(container: str, name: str, size_mib: int, docker: bool = False) -> None:
        directory = root / container
        directory.mkdir(parents=True, exist_ok=True)
        if docker:  # docker's checkpoint is a directory of CRIU's files
            (directory / name).mkdir()
            (directory / name / "pages-1.img").write_bytes(b"\0" * (size_mib * mib))
        else:
            (directory / f"{name}.tar.zst").write_bytes(b"\0" * (size_mib * mib))
            (directory / f"{name}.tar.zst.sig").write_bytes(b"sig")
    checkpoint("a" * 64, "20261125T010000Z", 4)
    checkpoint("a" * 64, "20261125T030000Z", 4)
    checkpoint("b" * 64, "20261125T020000Z", 4, docker=True)
    checkpoint("b" * 64, "20261125T040000Z", 4, docker=True)
    checkpoint("c" * 64, "20261125T000000Z", 4)  # a container gone: its only checkpoint counts too
    recorded = {"a" * 64, "b" * 64}

    gone = prune_to_budget(str(root), 9 * mib, recorded)
    assert gone == ["cccccccccccc/20261125T000000Z", "aaaaaaaaaaaa/20261125T010000Z",
                    "bbbbbbbbbbbb/20261125T020000Z"]
    assert sorted(p.name for p in (root / ("a" * 64)).iterdir()) == ["20261125T030000Z.tar.zst",
                                                                     "20261125T030000Z.tar.zst.sig"]
    assert [p.name for p in (root / ("b" * 64)).iterdir()] == ["20261125T040000Z"]
    assert list((root / ("c" * 64)).iterdir()) == []
    # below what the newest of each recorded container takes, those stay all the same
    assert prune_to_budget(str(root), 1 * mib, recorded) == []
    assert prune_to_budget(str(root), 0, set()) == []  # 0: no budget
