"""The node under concurrent work, CI's size (bench/load.py is the full run): containers through their whole
lifecycle via gpuckpt-runtime at once, then checkpoint/restore cycles of one, every restore verified."""

from __future__ import annotations

import json
import subprocess
import sys

from bed import HERE

LOAD = HERE.parent / "bench" / "load.py"


def test_concurrent_lifecycles_and_repeated_cycles_lose_nothing(runc_delegate, tmp_path) -> None:
    out = tmp_path / "load.json"
    containers, cycles = 6, 5
    subprocess.run([sys.executable, str(LOAD), "--containers", str(containers), "--cycles", str(cycles),
                    "--out", str(out)], check=True, timeout=1500)
    result = json.loads(out.read_text())
    assert result["failures"] == 0, result["failures_by_step"]
    # every step ran: run, exec, checkpoint, restore, the restored state, stop, rm for each container;
    # run, (checkpoint, restore, state) per cycle and rm for the cycled one
    assert result["steps"] == containers * 7 + 2 + cycles * 3
    latency = result["passthrough_state_ms"]
    assert latency["gpuckpt-runtime"]["samples"] > 0 and latency["gpuckpt-runtime"]["failed"] == 0
