"""Standby restore of a GPU inference server through podman (issue 34 item 1): `gpuckpt restore --standby` of
an archive of the warm graph server holds no GPU memory, `gpuckpt resume` brings it back and it answers with
the bytes it answered cold; resume-to-first-answer beside the cold start of the same run, and the host memory
the standby held. Results: `standby` (standby_resume_s, standby_resume_over_cold, standby_host_bytes)."""

from __future__ import annotations

import os
from pathlib import Path

import cold_vs_restore
import harness
import pytest

pytestmark = pytest.mark.gpu


def test_standby(results: dict, podman: harness.Podman) -> None:
    name = f"gpu-standby-{os.getpid()}"
    state = harness.StateDir(name, harness.WORK / f"{name}-state")
    archive = Path("/var/tmp") / f"{name}.tar.zst"
    site, eager, model = cold_vs_restore.prepare_model()
    found: dict = {"model": model}
    results["standby"] = found
    try:
        with harness.nftables_network_lock(), harness.resident_helper(harness.result_path("runtimed", ".log")):
            podman.import_rootfs()
            cold = cold_vs_restore.cold_start(podman, name, cold_vs_restore.server_run_args(
                podman, "graph", site, state.directory))
            cold_vs_restore.near_eager(cold["answer"], eager)
            found["cold_s"] = cold["s"]
            cold_vs_restore.standby_path(podman, name, archive, cold["answer"], eager, found)
    finally:
        podman.cli("rm", "-f", name, check=False)
        archive.unlink(missing_ok=True)
        Path(f"{archive}.sig").unlink(missing_ok=True)
    standby = found["standby"]
    found.update(standby_resume_s=standby["s"], standby_resume_over_cold=round(standby["s"] / cold["s"], 3),
                 standby_host_bytes=standby["host_bytes"])
    harness.log(f"standby: resume to first answer {standby['s']:.2f} s against cold {cold['s']:.2f} s "
                f"({found['standby_resume_over_cold']}x), {standby['host_bytes'] / 2**30:.2f} GiB of host memory "
                f"held for {standby['device_bytes'] / 2**30:.2f} GiB of device data")
    assert standby["gpu_used_mib"]["resumed"] > standby["gpu_used_mib"]["standby"], standby["gpu_used_mib"]
