"""Standby restores and the warm pool (issue 34) with real runc, CRIU and podman, no GPU.

The driver side runs through integration/fake_gpu_runtime.py (the shim's own main over a fake driver whose
state lives in a file): a standby restore leaves the restored process checkpointed and calls no driver restore
or unlock, and the resume `gpuckpt resume` runs does both. The pool runs in this process over real podman
containers (a CPU workload: its standby restore is a full one), restored by `gpuckpt restore --standby`:
the budget, a restart, and a signature that no longer verifies.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from bed import COUNTER_SOURCE, GPUCKPT, PODMAN_IMAGE, sh
from fake_gpu_runtime import FileDriver, StateFile, fake_node
from test_faults import Case

from gpuckpt.cuda.suspend import STANDBY_ENGINE, recorded_pairs, resume
from gpuckpt.node.config import PoolConfig
from gpuckpt.node.suspension import read_suspension
from gpuckpt.service.pool import PodmanStandbys, Pool
from gpuckpt.trust.provenance import signature_path


@pytest.fixture
def own_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's config, state and journal directories (the node's /etc/gpuckpt/config.toml is left alone):
    the shims it starts inherit them."""
    monkeypatch.setenv("GPUCKPT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUCKPT_JOURNAL_DIR", str(tmp_path / "journal"))
    return tmp_path


@pytest.fixture
def standby_case(rootfs, own_node, monkeypatch) -> Iterator[Case]:
    case = Case(rootfs, own_node, "runc", gpu=True)
    case.id = f"standby-{os.getpid()}"
    config = own_node / "config.toml"
    config.write_text(f'delegate = "{case.delegate}"\n[cuda]\nstandby_annotation = true\nhost_hugepages = "leave"\n')
    config.chmod(0o644)
    monkeypatch.setenv("GPUCKPT_CONFIG", str(config))
    yield case
    case.remove()
    case.forget_journal()


def test_a_standby_restore_leaves_the_process_checkpointed_and_resume_brings_it_back(standby_case: Case) -> None:
    case = standby_case
    case.run()
    case.counter()
    images = case.dir / "images"
    status, line = case.checkpoint(images)
    assert status == 0, line
    assert case.driver_states() == {"1": "CHECKPOINTED"}
    spec = json.loads((case.bundle / "config.json").read_text())
    spec.setdefault("annotations", {})["io.gpuckpt.restore"] = "standby"
    (case.bundle / "config.json").write_text(json.dumps(spec))
    calls_before = len(StateFile(str(case.fake_state)).read().get("calls", []))
    status, line = case.restore(images)
    assert status == 0, line
    assert case.status() == "running"  # what podman shows for it too: running, its CUDA processes suspended
    calls = StateFile(str(case.fake_state)).read()["calls"][calls_before:]
    assert not [call for call in calls if call.split()[0] in ("restore", "unlock")], calls
    assert case.driver_states() == {"1": "CHECKPOINTED"}
    assert any("restored into standby" in message for message in case.logged())
    record = read_suspension(case.id)
    assert record is not None and record.engine == STANDBY_ENGINE and len(record.processes) == 1
    assert record.host_bytes > 0

    state = StateFile(str(case.fake_state))
    resume(FileDriver(state), record, recorded_pairs(record), gpus=fake_node(state))  # what `gpuckpt resume` runs
    calls = state.read()["calls"][calls_before:]
    assert [call.split()[0] for call in calls] == ["restore", "unlock"], calls
    assert case.driver_states() == {"1": "RUNNING"}
    case.continues_from(case.counter())


def test_the_annotation_is_refused_where_the_operator_did_not_allow_it(standby_case: Case, own_node) -> None:
    case = standby_case
    (own_node / "config.toml").write_text(f'delegate = "{case.delegate}"\n')
    case.run()
    case.counter()
    images = case.dir / "images"
    assert case.checkpoint(images)[0] == 0
    spec = json.loads((case.bundle / "config.json").read_text())
    spec.setdefault("annotations", {})["io.gpuckpt.restore"] = "standby"
    (case.bundle / "config.json").write_text(json.dumps(spec))
    status, line = case.restore(images)
    assert status != 0 and "cuda.standby_annotation = true" in line and "\n" not in line
    assert case.status() == "gone" and case.driver_states() == {"1": "CHECKPOINTED"}


# -- the pool over podman ------------------------------------------------------------------------


@pytest.fixture
def signed_archive(tmp_path) -> Iterator[Path]:
    """An archive of a CPU counter container, exported (and signed with this node's key) by gpuckpt (the
    node's delegate, as its config names it)."""
    name = f"standby-source-{os.getpid()}"
    sh("podman", "run", "-d", "--name", name, "--network", "none", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
    archive = tmp_path / "standby-counter.tar.zst"
    try:
        sh(GPUCKPT, "export", name, "-o", str(archive))
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
    yield archive


@pytest.fixture
def pool_node(tmp_path) -> Iterator[list[str]]:
    """Every container the pool made removed after. (Its records go to this test's directory; the node's state
    directory stays the node's: podman's shim finds the staged restores there.)"""
    said: list[str] = []
    yield said
    for name in sh("podman", "ps", "-a", "--format", "{{.Names}}").stdout.split():
        if name.startswith(f"standby-pool-{os.getpid()}-"):
            sh("podman", "rm", "-f", "-t", "0", name, check=False)


def exists(container_id: str) -> bool:
    return sh("podman", "container", "exists", container_id, check=False).returncode == 0


def test_the_pool_over_podman_budget_restart_and_a_bad_signature(signed_archive: Path, pool_node, tmp_path) -> None:
    said, prefix, records = pool_node, f"standby-pool-{os.getpid()}-", str(tmp_path / "pool")
    checkpoint = str(signed_archive)
    first = Pool(PoolConfig(standbys={checkpoint: 1}, host_budget_bytes=1 << 40), PodmanStandbys(), said.append,
                 name_prefix=prefix, directory=records)
    assert "restored in standby" in first.fill()[0], said
    one = first.records()[0]
    assert one.container.startswith(prefix) and exists(one.container_id) and one.host_bytes > 0
    running = sh("podman", "inspect", "--format", "{{.State.Status}}", one.container).stdout.strip()
    assert running == "running"  # a CPU checkpoint's standby is a full restore

    # the budget: room for about two and a half
    budget = one.host_bytes * 5 // 2
    pool = Pool(PoolConfig(standbys={checkpoint: 3}, host_budget_bytes=budget), PodmanStandbys(), said.append,
                name_prefix=prefix, directory=records)
    lines = pool.fill()
    assert len(pool.records()) == 2 and "pool.host_budget_bytes" in lines[-1], lines

    # a restarted gpuckptd keeps them, and restores nothing twice
    again = Pool(PoolConfig(standbys={checkpoint: 2}, host_budget_bytes=budget), PodmanStandbys(), said.append,
                 name_prefix=prefix, directory=records)
    held = again.records()
    assert again.sweep() == [] and again.fill() == [] and again.records() == held

    taken, _ = again.take(checkpoint)
    assert taken == held[0] and exists(taken.container_id)
    assert again._filling is not None
    again._filling.join(300)
    assert len(again.records()) == 2  # the next one restored in the background

    # a signature that no longer verifies: every standby of it removed, none restored from it
    standbys = [record.container_id for record in again.records()]
    Path(signature_path(checkpoint)).write_text('{"key_id": "x", "payload": "e30=", "signature": "AAAA"}')
    removed = again.sweep()
    assert len(removed) == 2 and not again.records(), removed
    assert not any(exists(container_id) for container_id in standbys)
    assert again.fill()[0].startswith(f"pool: no standby of {checkpoint}")
    assert exists(taken.container_id)  # the one handed out is no longer the pool's
