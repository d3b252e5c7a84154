"""gpuckptd treats a labelled group as one: a drain checkpoints its members together (`gpuckpt checkpoint --group`)
and the others one by one, a restore brings the group back together, and a periodic checkpoint due for a member
takes the whole group once, left running. podman is tests/fake_podman.py and gpuckpt a stand-in that logs its
argv on PATH (the service runs both as programs)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from gpuckpt.node.config import ServiceConfig
from gpuckpt.node.inventory import write_record
from gpuckpt.service.operations import Operations, drained, recorded
from gpuckpt.service.schedule import Schedule

# gpuckpt's stand-in: every call logged; a group checkpoint stops the members (as podman's checkpoints do) and
# leaves a checkpoint directory in each one's storage; `export` writes the archive it is told to
FAKE_GPUCKPT = """
import json, sys
from pathlib import Path
here = Path(__file__).resolve().parent
argv = sys.argv[1:]
with open(here / "gpuckpt.log", "a") as log:
    log.write(json.dumps(argv) + "\\n")
setup = json.loads((here / "podman.json").read_text())
if argv[0] in setup.get("gpuckpt_fails", []):
    print("gpuckpt " + argv[0] + ": member b: refused by the stand-in", file=sys.stderr)
    sys.exit(1)
label = argv[argv.index("--group") + 1] if "--group" in argv else None
for name, container in setup["containers"].items():
    if label is not None and container["labels"].get("io.gpuckpt.group") == label:
        if argv[0] == "checkpoint":
            (here / "storage" / container["id"] / "checkpoint").mkdir(parents=True, exist_ok=True)
            (here / "storage" / container["id"] / "checkpoint" / "pages-1.img").write_bytes(b"x" * 4096)
            if "--leave-running" not in argv:
                container["status"] = "exited"
        else:
            container["status"] = "running"
if argv[0] == "export":
    Path(argv[argv.index("-o") + 1]).write_bytes(b"archive")
    if "--leave-running" not in argv:  # a periodic checkpoint's export leaves it running
        next(each for each in setup["containers"].values() if each["id"] in argv)["status"] = "exited"
(here / "podman.json").write_text(json.dumps(setup))
"""


class Node:
    """Containers a and b (group job) and c (alone), recorded by the hook as it would; the two stand-ins."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dir = tmp_path / "bin"
        self.dir.mkdir()
        self.ids = {name: f"{name * 12}{'0' * 52}" for name in "abc"}
        self.setup = {"containers": {name: {"id": self.ids[name], "pid": os.getpid(), "status": "running",
                                            "cuda": False, "labels": {"io.gpuckpt.group": "job"} if name != "c" else {}}
                                     for name in "abc"}}
        self.write()
        shutil.copy(Path(__file__).parent / "fake_podman.py", self.dir / "fake_podman.py")
        (self.dir / "fake_gpuckpt.py").write_text(FAKE_GPUCKPT)
        for program, script in (("podman", "fake_podman.py"), ("gpuckpt", "fake_gpuckpt.py")):
            (self.dir / program).write_text(f"#!/bin/sh\nexec {sys.executable} {self.dir / script} \"$@\"\n")
            (self.dir / program).chmod(0o755)
        monkeypatch.setenv("PATH", f"{self.dir}:{os.environ['PATH']}")
        monkeypatch.setenv("GPUCKPT_INVENTORY_DIR", str(tmp_path / "inventory"))
        for name in "abc":
            write_record({"version": 1, "id": self.ids[name], "engine": "podman", "bundle": f"/b/{name}",
                          "pid": os.getpid(), "gpus": [], "created": "2026-11-28T05:00:00Z"})
        # one at a time: the stand-ins share podman.json without a lock
        self.config = ServiceConfig(archive_dir=str(tmp_path / "archive"), drain_parallel=1)
        self.operations = Operations(self.config)

    def write(self) -> None:
        (self.dir / "podman.json").write_text(json.dumps(self.setup))

    def gpuckpt_calls(self) -> list[list[str]]:
        log = self.dir / "gpuckpt.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def service_node(tmp_path, monkeypatch, node) -> Node:
    monkeypatch.setenv("GPUCKPT_JOURNAL_SOCKET", "/nonexistent")
    return Node(tmp_path, monkeypatch)


def test_a_drain_takes_a_group_together_and_its_restore_brings_it_back_together(service_node: Node) -> None:
    events: list = []
    result = service_node.operations.drain(events.append)
    assert result.ok, result
    calls = service_node.gpuckpt_calls()
    assert calls.count(["checkpoint", "--group", "job"]) == 1
    assert [call[:2] for call in calls if call[0] == "export"] == [["export", service_node.ids["c"]]]  # alone
    records = {name: record for record in drained(service_node.config.archive_dir)
               for name, container_id in service_node.ids.items() if record.id == container_id}
    assert sorted(records) == ["a", "b", "c"]
    assert [records[name].group for name in "abc"] == ["job", "job", ""]
    assert records["a"].checkpoint.endswith("/checkpoint") and records["a"].bytes == 4096

    result = service_node.operations.restore(events.append)
    assert result.ok, result
    calls = service_node.gpuckpt_calls()
    assert calls.count(["restore", "--group", "job"]) == 1
    assert [call[0] for call in calls if call[0] == "import"] == ["import"]  # c's archive, alone
    assert drained(service_node.config.archive_dir) == []


def test_a_group_that_fails_fails_every_member_and_keeps_nothing_half(service_node: Node) -> None:
    service_node.setup["gpuckpt_fails"] = ["checkpoint"]
    service_node.write()
    events: list = []
    result = service_node.operations.drain(events.append)
    assert not result.ok
    assert sorted(result.failed) == sorted(service_node.ids[name] for name in "ab")
    failed = [event for event in events if getattr(event, "state", "") == "failed"]
    assert all("member b: refused by the stand-in" in event.message for event in failed)
    assert {record.id for record in drained(service_node.config.archive_dir)} == {service_node.ids["c"]}


def test_a_periodic_checkpoint_due_for_members_takes_the_group_once_left_running(service_node: Node) -> None:
    schedule = Schedule(service_node.config, service_node.operations, utilization=dict)
    records = recorded()
    group = [record for record in records if record.id != service_node.ids["c"]]
    schedule._act([], group, [], now=1000.0)
    assert service_node.gpuckpt_calls() == [["checkpoint", "--group", "job", "--leave-running"]]
    assert {schedule.last_outcome[record.id][1] for record in group} == {"group job: 2 member(s) in podman's store"}
    assert all(schedule.last_checkpoint[record.id] == 1000.0 for record in group)
