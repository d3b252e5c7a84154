"""runc's `state` output read into its model: what the verbs need, or one line naming the field."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuckpt.errors import DelegateError
from gpuckpt.shim.delegate import container_exists, container_state


def runtime_printing(tmp_path: Path, output: str, status: int = 0) -> str:
    path = tmp_path / "runc"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {status}\n")
    os.chmod(path, 0o755)
    return str(path)


def test_runc_state_is_read_into_the_model(tmp_path) -> None:
    runc = runtime_printing(tmp_path, '{"ociVersion": "1.0.2", "id": "ctr", "pid": 42, "status": "running", '
                                      '"bundle": "/b", "rootfs": "/b/rootfs", "owner": "", '
                                      '"annotations": {"io.gpuckpt.suspend-on-pause": "true"}}')
    state = container_state(runc, ["--root", "/r"], "ctr")
    assert (state.id, state.pid, state.status, state.bundle) == ("ctr", 42, "running", "/b")
    assert state.annotations == {"io.gpuckpt.suspend-on-pause": "true"}
    assert container_exists(runc, [], "ctr")


@pytest.mark.parametrize("output, message", [
    ("not json", "runc state ctr: output: Invalid JSON"),
    ('{"id": "ctr", "status": "running", "pid": -1}',
     "runc state ctr: pid: Input should be greater than or equal to 0"),
    ('{"id": "ctr", "status": "exploded"}', "runc state ctr: status: Input should be 'creating', 'created'"),
])
def test_a_state_the_shim_cannot_use_is_one_line(tmp_path, output, message) -> None:
    with pytest.raises(DelegateError) as raised:
        container_state(runtime_printing(tmp_path, output), [], "ctr")
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_a_container_the_runtime_does_not_know_does_not_exist(tmp_path) -> None:
    assert not container_exists(runtime_printing(tmp_path, "container does not exist", status=1), [], "gone")
