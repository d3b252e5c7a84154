"""The GPU scenarios (the only tests of the real CUDA driver) as pytest tests marked `gpu`, and their harness.

Each scenario is a test_* function of a test_*.py file here, named as the committed results name it
(results/gpu/gpu_tests-*.json: disk_and_shm, killed_shim, docker...; run_tests.py ran them before): it starts
a CUDA workload through gpuckpt-runtime (runc, podman or docker), checkpoints and restores it, asserts that the
workload goes on from its state with its device data intact, and fills the
`results` fixture with its figures. The `gpu_run` fixture prepares the machine once (harness.install(): the
carry pack unpacked, runc/CRIU first on PATH, gpuckpt and its wheels on a private path, the launchers, the node
key) and writes, under the results folder (`--gpu-results DIR`, else $GPUCKPT_GPU_RESULTS, else $OUT, else
/tmp/gpuckpt-gpu/results):
  SCENARIO-MACHINE.json  one per scenario: machine, gpus, facts, passed / failed / not_run, its figures
  gpu_tests-MACHINE.json all of this run's scenarios together (the fields gpu_tests.json always had)
  multigpu-MACHINE.json  the training jobs side by side, when any ran
and beside them what scenarios keep (downtime-MACHINE.json, CRIU's logs of a failed step...). MACHINE is
"h100", "h200x2"...: the GPU's model and their count.

Where there is no NVIDIA GPU, no carry pack or no root (CI), every test here is skipped at collection with one
line saying which, before any fixture runs: `pytest tests integration` pays nothing for them.

How to run them (the lead, through the device tool's `run`, which copies the working tree to the GPU machine
and runs one command in its root there as root, $OUT the folder that comes back, at most 8 files, and ten
minutes a command: choose scenarios with -k):
  1. here, as root on a set-up Debian machine: `bash integration/gpu/pack-carry.sh podman` (or docker, none:
     both engines do not fit in one call) makes .carry.tar.xz, an ignored path;
  2. `run` with carry [".carry.tar.xz"] and the command:
     set -o pipefail; R=/var/tmp/gpu-results; rm -rf $R; mkdir -p $R; python3 -m pytest -s -p no:cacheprovider
     --confcutdir=integration/gpu -m gpu integration/gpu --gpu-results $R -k 'disk_and_shm or test_leave_running'
     2>&1 | tee $OUT/pytest-gpu.log; rc=$?; cp $R/gpu_tests-*.json $OUT/ 2>/dev/null;
     tar -C $R -czf $OUT/gpu-results.tgz .; exit $rc
     (one line; python3 there is the torch interpreter, which has pytest; -s streams the scenarios' log lines
     into the log as they happen; --confcutdir keeps integration/conftest.py out: it needs the test bed's
     gpuckpt, which exists there only once gpu_run has installed it.)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parent
if str(GPU_DIR) not in sys.path:  # the scenario scripts import harness.py by name, as scripts do
    sys.path.insert(0, str(GPU_DIR))
import harness  # noqa: E402  (standard library only at import: collection on CI needs nothing more)

_REPORTS = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gpu-results", metavar="DIR", default=None,
                     help="where the GPU scenarios write their JSON results (default: $GPUCKPT_GPU_RESULTS, "
                          "else $OUT, else /tmp/gpuckpt-gpu/results)")
    parser.addoption("--inject", choices=harness.INJECT_MODES, default=None,
                     help="how the GPU reaches the containers: binds (device nodes and the host's userland bound "
                          "in) or cdi (the self-contained image, the driver from the node's CDI spec); default "
                          "$GPUCKPT_GPU_INJECT, else binds")


def pytest_configure(config: pytest.Config) -> None:
    chosen = config.getoption("inject", default=None) or harness.INJECT
    if chosen not in harness.INJECT_MODES:
        raise pytest.UsageError(f"GPUCKPT_GPU_INJECT={chosen!r}: expected one of {', '.join(harness.INJECT_MODES)}")
    harness.INJECT = chosen
    config.addinivalue_line("markers", "torch_compile: runs torch.compile (CDI mode's image then holds Triton and gcc)")


def pytest_collection_finish(session: pytest.Session) -> None:
    harness.IMAGE_COMPILE = any(item.get_closest_marker("torch_compile") for item in session.items)


def not_here() -> str | None:
    """Why the GPU scenarios cannot run on this machine (one line), or None."""
    if not shutil.which("nvidia-smi") or not any(Path("/dev").glob("nvidia[0-9]*")):
        return "no NVIDIA GPU here (needs nvidia-smi and /dev/nvidiaN)"
    if not (harness.REPO / ".carry.tar.xz").exists() and not (harness.CARRY / "bin").is_dir():
        return "no carry pack: make .carry.tar.xz with integration/gpu/pack-carry.sh and carry it"
    if os.geteuid() != 0:
        return "needs root (installs gpuckpt-runtime, runs containers)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if GPU_DIR in item.path.resolve().parents]
    reason = not_here() if ours else None
    for item in ours if reason else []:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    item.stash.setdefault(_REPORTS, {})[call.when] = (outcome.get_result(), call.excinfo)


class GpuRun:
    """This run's results: the machine, and every scenario's outcome and figures, written as each ends."""

    def __init__(self, out: Path, facts: dict, gpus: list[dict]) -> None:
        self.out, self.tag = out, harness.machine_tag(gpus)
        # "machine" as the earlier results have it (nvidia-smi's line), "gpus" each card's name, driver and UUID
        self.machine = {"machine": facts["nvidia_smi"], "gpus": gpus, "facts": facts, "inject": harness.INJECT}
        self.all: dict = {**self.machine, "passed": [], "failed": {}, "not_run": {}}

    def record(self, item: pytest.Item, found: dict) -> None:
        name = getattr(item, "originalname", item.name).removeprefix("test_")
        reports = item.stash.get(_REPORTS, {})
        report, excinfo = reports.get("call") or reports["setup"]
        outcome: dict = {"passed": [], "failed": {}, "not_run": {}}
        if "call" not in reports and report.passed:  # set up, never called to its end: the device call's limit
            outcome["not_run"][name] = "interrupted before it ended"
        elif report.passed:
            outcome["passed"].append(name)
        elif report.skipped:
            outcome["not_run"][name] = getattr(excinfo.value, "msg", str(excinfo.value)) if excinfo else "skipped"
        else:
            outcome["failed"][name] = f"{excinfo.typename}: {excinfo.value}"[-2000:] if excinfo else "failed"
        (self.out / f"{name}-{self.tag}.json").write_text(json.dumps({**self.machine, **outcome, **found}, indent=2))
        self.all["passed"] += outcome["passed"]
        self.all["failed"].update(outcome["failed"])
        self.all["not_run"].update(outcome["not_run"])
        self.all.update(found)
        (self.out / f"gpu_tests-{self.tag}.json").write_text(json.dumps(self.all, indent=2))

    def finish(self) -> None:
        if summary := multigpu_summary(self.all):
            (self.out / f"multigpu-{self.tag}.json").write_text(json.dumps(summary, indent=2))


def results_dir(config: pytest.Config) -> Path:
    chosen = (config.getoption("gpu_results", default=None) or os.environ.get("GPUCKPT_GPU_RESULTS")
              or os.environ.get("OUT") or "/tmp/gpuckpt-gpu/results")
    return Path(chosen).resolve()


@pytest.fixture(scope="session")
def gpu_run(pytestconfig: pytest.Config) -> Iterator[GpuRun]:
    """The machine prepared once (harness.install()), and where the results go."""
    out = results_dir(pytestconfig)
    out.mkdir(parents=True, exist_ok=True)
    harness.OUT = out
    facts = harness.install()
    run = GpuRun(out, facts, harness.gpus())
    harness.MACHINE_TAG = run.tag
    harness.log(f"GPU scenarios on {facts['nvidia_smi']} ({harness.INJECT}), results in {out}")
    yield run
    run.finish()


@pytest.fixture
def results(request: pytest.FixtureRequest, gpu_run: GpuRun) -> Iterator[dict]:
    """The scenario's figures, keyed as the earlier results have them; written with its outcome when it ends."""
    harness.log(f"--- {request.node.name.removeprefix('test_')}")
    found: dict = {}
    yield found
    gpu_run.record(request.node, found)


# docker, podman and two_gpus take `results` so that it is set up first: their skips are then recorded too

@pytest.fixture
def docker(results: dict) -> harness.Docker:
    """The carried docker engine (not started); skipped where this call's carry pack has none."""
    if not (harness.CARRY / "docker" / "bin" / "dockerd").exists():
        pytest.skip("the carry pack has no docker engine (integration/gpu/pack-carry.sh docker)")
    if harness.INJECT == "cdi":
        pytest.skip("--inject cdi: the carried docker is 20.10, which has no CDI devices (docker >= 25 has)")
    return harness.Docker()


@pytest.fixture
def docker28(results: dict) -> harness.Docker28:
    """The carried docker 28 (not started), for CDI-started containers: skipped without it or without --inject cdi."""
    harness.unpack_docker28()
    if not (harness.Docker28.CARRIED / "bin" / "dockerd").exists():
        pytest.skip("no docker 28 carried (integration/gpu/pack-carry.sh docker28: .carry-docker28.tar.xz, carried "
                    "by a call of its own on the same warm machine)")
    if harness.INJECT != "cdi":
        pytest.skip("docker 28's scenario starts its container with CDI devices from the self-contained image: "
                    "--inject cdi")
    return harness.Docker28()


@pytest.fixture
def podman(results: dict) -> harness.Podman:
    """The carried podman, configured with gpuckpt-runtime; skipped where this call's carry pack has none."""
    if not (harness.CARRY / "podman" / "bin" / "podman").exists():
        pytest.skip("the carry pack has no podman (integration/gpu/pack-carry.sh podman)")
    return harness.Podman()


@pytest.fixture
def two_gpus(results: dict) -> None:
    if harness.gpu_count() < 2:
        pytest.skip("this machine has one GPU")


def multigpu_summary(results: dict) -> dict:
    """The training-job figures side by side: bit-exactness per shape, one rank against two."""
    ran = {key: results[key] for key in ("dataloader_fork", "dataloader_spawn", "ddp_1", "ddp_2", "podman_ddp_2",
                                         "podman_tp_2", "podman_gpu_scaling", "podman_group_ddp_2") if key in results}
    if not ran:
        return {}
    summary: dict = {"machine": results["machine"], "gpus": results["gpus"], "passed": results["passed"],
                     "failed": results["failed"],
                     "dataloader_bit_exact": ran.get("dataloader_fork", {}).get("bit_exact"),
                     "dataloader_spawn_bit_exact": ran.get("dataloader_spawn", {}).get("bit_exact"),
                     "nccl_bit_exact": ran.get("ddp_2", {}).get("bit_exact"),
                     "restore_on_other_gpu_ok": "restore_on_other_gpu" in results["passed"]}
    if "podman_ddp_2" in ran:  # through podman (test_multi_gpu_podman.py): restore, left running, imported
        podman_ddp = ran["podman_ddp_2"]
        summary["podman_nccl_bit_exact"] = all(podman_ddp.get(key) for key in (
            "bit_exact_restore", "bit_exact_left_running", "bit_exact_import"))
        summary["dataloader_bit_exact"] = summary["dataloader_bit_exact"] or summary["podman_nccl_bit_exact"]
    if "podman_tp_2" in ran:
        summary["tp_server_same_answers"] = all(ran["podman_tp_2"].get(key) for key in (
            "same_after_restore", "same_left_running", "same_after_import"))
    if "podman_group_ddp_2" in ran:  # test_group_gpu.py: one rank per container, checkpointed as a group
        summary["group_checkpoint_ok"] = bool(ran["podman_group_ddp_2"].get("bit_exact"))
    scaling = ran.get("podman_gpu_scaling", {})
    for count in (2, 4):
        if f"{count}_over_1_device_checkpoint" in scaling:
            summary[f"{'two' if count == 2 else 'four'}_over_one_device_checkpoint"] = \
                scaling[f"{count}_over_1_device_checkpoint"]
    one, two = ran.get("ddp_1", {}).get("manifest_timings"), ran.get("ddp_2", {}).get("manifest_timings")
    if one and two:
        for phase in ("device_checkpoint_s", "dump_s", "total_s"):
            summary[f"one_rank_{phase}"], summary[f"two_ranks_{phase}"] = one[phase], two[phase]
        summary["two_over_one_device_checkpoint"] = round(two["device_checkpoint_s"] / one["device_checkpoint_s"], 3)
        summary["one_rank_restore_s"] = ran["ddp_1"]["restore_s"]
        summary["two_ranks_restore_s"] = ran["ddp_2"]["restore_s"]
    summary["runs"] = ran
    return summary
