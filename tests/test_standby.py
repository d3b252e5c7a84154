"""Standby restores (issue 34 item 1) over the fake driver: the shim restores the processes and leaves them
checkpointed (no driver restore, no unlock, no cuInit), records the GPUs it chose; the resume that
`gpuckpt resume` runs brings them onto those GPUs."""

from __future__ import annotations

import json

import pytest
import test_gpu_verbs
from support import write_config
from test_gpu_verbs import H100, UUID0, UUID1, checkpointed_node, restore_args

from gpuckpt.cuda.devices import GpuInfo
from gpuckpt.cuda.driver import ProcessState
from gpuckpt.cuda.node import NodeGpus
from gpuckpt.cuda.suspend import STANDBY_ENGINE, recorded_pairs, resume
from gpuckpt.node.suspension import read_suspension
from gpuckpt.policy.annotations import PolicyError
from gpuckpt.shim import restore

make_node = test_gpu_verbs.make_node


def annotate(node, value: str) -> None:
    spec = json.loads((node.bundle / "config.json").read_text())
    spec["annotations"]["io.gpuckpt.restore"] = value
    (node.bundle / "config.json").write_text(json.dumps(spec))


def on_gpu1(node) -> None:
    node.gpus["container_gpus"] = (lambda spec, pids, gpus=None: [
        GpuInfo(index=1, uuid=UUID1, name=H100, memory_total_bytes=80 << 30, memory_free_bytes=79 << 30, minor=1)])


def test_standby_restore_calls_no_driver_restore_nor_unlock_and_records_the_gpus(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 2)
    on_gpu1(node)
    write_config(node.dir, "[cuda]\nstandby_annotation = true\n")
    annotate(node, "standby")
    before = len(node.driver.calls)
    assert restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus)) == 0
    assert "restore" in node.verbs_called()  # the delegate restored the processes
    called = {name for name, _ in node.driver.calls[before:]}
    assert not called & {"restore", "unlock", "lock", "checkpoint"}, called
    assert node.driver.init_count == 0  # no cuInit either: nothing of the driver's restore runs
    assert all(node.driver.states[pid] == ProcessState.CHECKPOINTED for pid in node.pids)
    record = read_suspension("ctr")
    assert record is not None and record.engine == STANDBY_ENGINE
    assert sorted(p.pid for p in record.processes) == sorted(node.pids)
    assert all(p.gpu_uuids == [UUID0] for p in record.processes)  # the checkpoint's GPU
    assert record.gpu_pairs == [(UUID0, UUID1)]  # and the one the node check chose for the resume
    assert record.host_bytes > 0  # the sleeps' resident memory, as a standby's holds its device state


def test_resume_of_a_standby_restores_onto_the_recorded_gpu_and_unlocks(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 2)
    on_gpu1(node)
    write_config(node.dir, "[cuda]\nstandby_annotation = true\n")
    annotate(node, "standby")
    assert restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus)) == 0
    record = read_suspension("ctr")
    assert record is not None
    node.gpus["descendants"] = lambda pid: list(node.pids)  # the fake container's processes are siblings
    gpus = NodeGpus(**node.gpus)
    seconds = resume(node.driver, record, recorded_pairs(record), gpus=gpus)  # what `gpuckpt resume` runs
    assert seconds >= 0 and node.all_running()
    assert sorted(node.driver.calls_of("restore")) == sorted(node.pids)
    assert sorted(node.driver.calls_of("unlock")) == sorted(node.pids)
    assert {pid: [(p.old_uuid, p.new_uuid) for p in pairs] for pid, pairs in node.driver.restored_pairs.items()} \
        == {pid: [(UUID0, UUID1)] for pid in node.pids}


def test_resume_refused_while_the_recorded_gpu_lacks_memory_leaves_the_standby(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    write_config(node.dir, "[cuda]\nstandby_annotation = true\n")
    annotate(node, "standby")
    assert restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus)) == 0
    record = read_suspension("ctr")
    assert record is not None
    full = record.model_copy(update={"processes": [p.model_copy(update={"device_bytes": 80 << 30})
                                                   for p in record.processes]})
    with pytest.raises(Exception, match="stays suspended"):
        resume(node.driver, full, recorded_pairs(full), gpus=NodeGpus(**node.gpus))
    assert node.driver.states[node.pids[0]] == ProcessState.CHECKPOINTED
    assert not node.driver.calls_of("restore")


@pytest.mark.hostile("annotation io.gpuckpt.restore=standby on a node whose operator did not allow it")
def test_the_annotation_is_refused_unless_the_operator_allows_it(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    annotate(node, "standby")
    before = len(node.calls())
    with pytest.raises(PolicyError, match="cuda.standby_annotation = true"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))
    assert len(node.calls()) == before and read_suspension("ctr") is None


@pytest.mark.hostile("annotation io.gpuckpt.restore with a value outside the allow-list")
def test_an_annotation_value_outside_the_list_is_refused(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    write_config(node.dir, "[cuda]\nstandby_annotation = true\n")
    annotate(node, "standby; rm -rf /")
    with pytest.raises(PolicyError, match="allowed values: full, standby"):
        restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus))


def test_full_restore_asked_by_the_annotation_restores_and_unlocks(make_node, monkeypatch) -> None:
    node = checkpointed_node(make_node, monkeypatch, 1)
    annotate(node, "full")  # needs no permission: it is what every restore does
    assert restore.run(restore_args(node), str(node.runtime), NodeGpus(**node.gpus)) == 0
    assert node.all_running() and read_suspension("ctr") is None
