"""Faults injected into real checkpoints and restores (#16 item 2): runc and crun, CRIU, real processes.

Each case makes one thing go wrong (the shim SIGKILLed at a phase, the delegate or CRIU
failing, a full disk, a race with kill/rm or a second checkpoint, a reboot) and checks
what a node operator needs: the container is running, or stopped and restorable from the
last good checkpoint; no CUDA process left locked or checkpointed; one line. The CUDA
phases run through integration/fake_gpu_runtime.py (the shim's own main over a fake driver
whose state outlives a killed shim); the GPU machine runs them over the real driver.

With GPUCKPT_FAULT_TABLE=FILE (integration/test.sh sets it), the outcomes observed are
written there as a table: each row is what the test saw, not what it expected.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bed import GPUCKPT, RUNTIME, RUNTIME_ROOT, assert_continues, configured_delegate, make_bundle, sh, wait_counter
from fake_gpu_runtime import StateFile

from gpuckpt.host.procfs import descendants, live_start_time, start_time
from gpuckpt.node.journal import DEFAULT_JOURNAL_DIR
from gpuckpt.node.lock import StateKey

HERE = Path(__file__).parent
FAKE_GPU_RUNTIME = HERE / "fake_gpu_runtime.py"
OUTCOMES: dict[str, tuple[str, str]] = {}


@pytest.fixture(scope="module", autouse=True)
def outcome_table() -> Iterator[None]:
    yield
    target = os.environ.get("GPUCKPT_FAULT_TABLE")
    if not target or not OUTCOMES:
        return
    lines = ["# Faults injected and outcomes", "",
             "Written by `integration/test_faults.py` (run by `integration/test.sh`): each row is a fault injected",
             "into a real checkpoint or restore (runc or crun, CRIU, real processes; CUDA phases over a fake driver",
             "whose state outlives a killed shim) and what the test then observed. The test asserts the",
             "container is running, or stopped and restorable from the last good checkpoint, that no CUDA process",
             "is left locked or checkpointed, and that the error is one line.", "",
             "| fault | test | observed |", "| --- | --- | --- |"]
    for nodeid, (fault, observed) in sorted(OUTCOMES.items()):
        lines.append(f"| {fault} | `{nodeid}` | {observed.replace('|', '/')} |")
    Path(target).write_text("\n".join(lines) + "\n")


@pytest.fixture
def record(request, tmp_path) -> Callable[[str, str], None]:
    """Keep what a test observed; the run's own names (its temporary directory, its PID in container IDs, the
    PIDs messages name) are written as TMP, PID and N so the table changes only when an outcome does."""
    def write(fault: str, observed: str) -> None:
        observed = observed.replace(str(tmp_path), "TMP").replace(f"-{os.getpid()}-", "-PID-")
        observed = re.sub(r"\bpid \d+", "pid N", observed)
        OUTCOMES[request.node.nodeid] = (fault, observed)
    return write


class Case:
    """One container through a slowed delegate: its bundle, images, the shim (real or over the fake driver)."""

    def __init__(self, rootfs: Path, tmp_path: Path, real_delegate: str, gpu: bool) -> None:
        self.rootfs, self.dir, self.gpu = rootfs, tmp_path, gpu
        self.id = f"gpuckpt-fault-{os.getpid()}-{real_delegate}"
        self.bundle = make_bundle(rootfs, tmp_path)
        if gpu:  # a GPU container as the shim sees one (the toolkit's variable); its CUDA process: container PID 1
            spec = json.loads((self.bundle / "config.json").read_text())
            spec["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=0")
            (self.bundle / "config.json").write_text(json.dumps(spec))
        self.fake_state = tmp_path / "fake-driver.json"
        self.fake_state.write_text(json.dumps({"processes": {"1": "RUNNING"} if gpu else {}, "delay_s": {},
                                               "fail": {}, "calling": ""}))
        # The delegate, slowed or failed on demand by files here (the name keeps "crun": the shim's check)
        self.delegate = tmp_path / f"slow-{real_delegate}"
        self.delegate.write_text(
            "#!/bin/sh\nverb=\nfor arg; do case \"$arg\" in checkpoint|restore) verb=$arg; break;; esac; done\n"
            f"d={tmp_path}\n"
            "[ -n \"$verb\" ] && [ -e \"$d/delay-$verb\" ] && sleep \"$(cat \"$d/delay-$verb\")\"\n"
            "[ -n \"$verb\" ] && [ -e \"$d/fail-$verb\" ] && { echo \"injected $verb failure\" >&2; exit 3; }\n"
            f"exec {shutil.which(real_delegate)} \"$@\"\n")
        self.delegate.chmod(0o755)
        (self.rootfs / "tmp" / "state").unlink(missing_ok=True)

    # -- the shim -------------------------------------------------------------------------------

    def argv(self, *args: str) -> list[str]:
        shim = [sys.executable, str(FAKE_GPU_RUNTIME), str(self.fake_state)] if self.gpu else [RUNTIME]
        return [*shim, "--root", RUNTIME_ROOT, "--log", str(self.dir / "shim.log"), "--log-format", "json", *args]

    def start(self, *args: str) -> subprocess.Popen:
        with open(os.devnull, "r+b") as null:
            return subprocess.Popen(self.argv(*args), stdin=null, stdout=null, stderr=null, cwd=self.bundle)

    def call(self, *args: str) -> tuple[int, str]:
        """Run the shim to its end: its status and the last error line it logged."""
        mark = self.log_size()
        status = self.start(*args).wait(timeout=300)
        return status, self.last_error(mark)

    def log_size(self) -> int:
        log = self.dir / "shim.log"
        return log.stat().st_size if log.exists() else 0

    def last_error(self, since: int = 0) -> str:
        log = self.dir / "shim.log"
        if not log.exists():
            return ""
        with open(log, "rb") as text:
            text.seek(since)
            entries = [json.loads(line) for line in text.read().decode().splitlines() if line.strip()]
        errors = [entry["msg"] for entry in entries if entry.get("level") == "error"]
        return errors[-1] if errors else ""

    def logged(self, since: int = 0) -> list[str]:
        with open(self.dir / "shim.log", "rb") as text:
            text.seek(since)
            return [json.loads(line)["msg"] for line in text.read().decode().splitlines() if line.strip()]

    def finished_by(self, *args: str, said: str) -> str:
        """The next verb on the container (`args`), which finishes the killed shim's journal first: it succeeds,
        and its line about the journal says `said`; that line."""
        mark = self.log_size()
        status, line = self.call(*args)
        assert status == 0, line
        finished = [msg for msg in self.logged(mark) if "a killed gpuckpt-runtime" in msg]
        assert finished and said in finished[0], self.logged(mark)
        return finished[0]

    def checkpoint_args(self, images: Path, *extra: str) -> tuple[str, ...]:
        return ("checkpoint", "--image-path", str(images), *extra, self.id)

    def restore_args(self, images: Path) -> tuple[str, ...]:
        return ("restore", "-d", "--bundle", str(self.bundle), "--image-path", str(images), self.id)

    def checkpoint(self, images: Path, *extra: str) -> tuple[int, str]:
        return self.call(*self.checkpoint_args(images, *extra))

    def restore(self, images: Path) -> tuple[int, str]:
        return self.call(*self.restore_args(images))

    # -- faults -----------------------------------------------------------------------------

    def slow(self, verb: str, seconds: float) -> None:
        (self.dir / f"delay-{verb}").write_text(str(seconds))

    def fail(self, verb: str) -> None:
        (self.dir / f"fail-{verb}").touch()

    def clear(self) -> None:
        for name in ("delay-checkpoint", "delay-restore", "fail-checkpoint", "fail-restore"):
            (self.dir / name).unlink(missing_ok=True)

    def driver(self, **changes: object) -> None:
        StateFile(str(self.fake_state)).update(lambda data: data.update(changes))

    def driver_states(self) -> dict[str, str]:
        return StateFile(str(self.fake_state)).read()["processes"]

    @property
    def journal_path(self) -> Path:
        """Its journal: named by its ID under the shim's --root (node/lock.py's StateKey)."""
        key = StateKey.of(self.id, os.path.realpath(RUNTIME_ROOT))
        return Path(os.environ.get("GPUCKPT_JOURNAL_DIR", DEFAULT_JOURNAL_DIR)) / f"{key.name}.json"

    def journal(self) -> dict | None:
        try:
            return json.loads(self.journal_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def kill_at(self, shim: subprocess.Popen, reached: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        """SIGKILL the shim once `reached` (polled), as the OOM killer or `kill -9` would."""
        deadline = time.monotonic() + timeout_s
        while not reached():
            assert shim.poll() is None, f"the shim ended ({shim.returncode}) before {what}"
            assert time.monotonic() < deadline, f"never reached {what}"
            time.sleep(0.02)
        shim.kill()
        shim.wait()

    def in_phase(self, phase: str) -> Callable[[], bool]:
        return lambda: (self.journal() or {}).get("phase") == phase and (
            phase not in ("dump", "restore") or bool((self.journal() or {}).get("delegate_pid")))

    def calling(self, call: str) -> Callable[[], bool]:
        return lambda: StateFile(str(self.fake_state)).read().get("calling", "").startswith(call)

    def wait_delegate_gone(self, timeout_s: float = 120) -> None:
        journal = self.journal() or {}
        pid = journal.get("delegate_pid", 0)
        deadline = time.monotonic() + timeout_s
        while pid and os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.1)

    # -- the container ----------------------------------------------------------------------

    def run(self) -> None:
        log = self.dir / "run.log"
        with open(os.devnull, "r+b") as null:
            result = subprocess.run([RUNTIME, "--root", RUNTIME_ROOT, "--log", str(log), "run", "-d", self.id],
                                    stdin=null, stdout=null, stderr=null, cwd=self.bundle, timeout=120)
        assert result.returncode == 0, log.read_text() if log.exists() else f"exit {result.returncode}"

    def status(self) -> str:
        found = sh(RUNTIME, "--root", RUNTIME_ROOT, "state", self.id, check=False)
        return json.loads(found.stdout)["status"] if found.returncode == 0 else "gone"

    def counter(self):
        return wait_counter(lambda: (self.rootfs / "tmp" / "state").read_text(), minimum=3)

    def continues_from(self, before) -> None:
        assert_continues(before, lambda: (self.rootfs / "tmp" / "state").read_text())

    def forget_journal(self) -> None:
        """A journal a failed test left would be finished by the next test's shim: not this test's business."""
        self.journal_path.unlink(missing_ok=True)

    def remove(self) -> None:
        sh(RUNTIME, "--root", RUNTIME_ROOT, "delete", "-f", self.id, check=False)

    def manifest_completed(self, images: Path) -> bool | None:
        path = images / "gpuckpt-manifest.json"
        return json.loads(path.read_text()).get("dump_completed") if path.exists() else None

    def observed(self, images: Path | None = None, line: str = "") -> str:
        parts = [f"container {self.status()}"]
        if self.gpu:
            parts.append("CUDA process(es) " + ", ".join(sorted(set(self.driver_states().values()))).lower())
        parts.append("journal left" if self.journal() else "no journal left")
        if images is not None:
            parts.append({True: "image complete", False: "image marked incomplete",
                          None: "no image"}[self.manifest_completed(images)])
        if line:
            parts.append(f"said: {line}")
        return "; ".join(parts)


@pytest.fixture(params=["runc", "crun"])
def cpu_case(request, rootfs, tmp_path) -> Iterator[Case]:
    case = Case(rootfs, tmp_path, request.param, gpu=False)
    with configured_delegate(str(case.delegate)):
        yield case
        case.remove()
        case.forget_journal()


@pytest.fixture(params=["runc", "crun"])
def gpu_case(request, rootfs, tmp_path) -> Iterator[Case]:
    case = Case(rootfs, tmp_path, request.param, gpu=True)
    with configured_delegate(str(case.delegate)):
        yield case
        case.remove()
        case.forget_journal()


@pytest.fixture
def runc_case(rootfs, tmp_path) -> Iterator[Case]:
    case = Case(rootfs, tmp_path, "runc", gpu=False)
    with configured_delegate(str(case.delegate)):
        yield case
        case.remove()
        case.forget_journal()


def one_line(text: str) -> bool:
    return bool(text) and "\n" not in text.strip()


# -- the shim SIGKILLed ---------------------------------------------------------------------------


def test_shim_killed_during_the_dump_the_next_restore_finishes_it(cpu_case: Case, record) -> None:
    case = cpu_case
    case.run()
    before = case.counter()
    images = case.dir / "images"
    case.slow("checkpoint", 2)
    case.kill_at(case.start(*case.checkpoint_args(images)), case.in_phase("dump"),
                 "the dump")
    assert case.journal() is not None  # the killed shim's
    case.wait_delegate_gone()  # the dump goes on without the shim, as it does under podman
    assert case.status() == "gone" and case.manifest_completed(images) is False
    case.clear()
    finished = case.finished_by(*case.restore_args(images), said="marked complete")
    case.continues_from(before)
    record("shim SIGKILLed while the delegate dumps (CPU container)", case.observed(images, finished))


def test_shim_killed_during_the_gpu_lock_the_next_checkpoint_unlocks_first(gpu_case: Case, record) -> None:
    case = gpu_case
    case.run()
    case.driver(delay_s={"lock": 3})
    images = case.dir / "images"
    case.kill_at(case.start(*case.checkpoint_args(images, "--leave-running")),
                 case.calling("lock"), "the lock")
    assert case.driver_states() == {"1": "LOCKED"} and case.journal() is not None
    case.driver(delay_s={})
    finished = case.finished_by(*case.checkpoint_args(images, "--leave-running"),
                                said="1 CUDA process(es) running again")
    assert case.driver_states() == {"1": "RUNNING"} and case.status() == "running"
    assert case.manifest_completed(images)
    record("shim SIGKILLed during the CUDA lock; the next checkpoint", case.observed(images, finished))


def test_shim_killed_during_the_device_checkpoint_recovery_resumes(gpu_case: Case, record) -> None:
    case = gpu_case
    case.run()
    before = case.counter()
    case.driver(delay_s={"checkpoint": 3})
    images = case.dir / "images"
    case.kill_at(case.start(*case.checkpoint_args(images)), case.calling("checkpoint"),
                 "the device checkpoint")
    assert case.driver_states() == {"1": "CHECKPOINTED"}
    case.driver(delay_s={})
    case.finished_by(*case.checkpoint_args(images), said="1 CUDA process(es) running again")  # then its own
    assert case.status() == "gone" and case.driver_states() == {"1": "CHECKPOINTED"}  # this one's own dump
    status, line = case.restore(images)
    assert status == 0, line
    assert case.driver_states() == {"1": "RUNNING"}
    case.continues_from(before)
    record("shim SIGKILLed during the device checkpoint; the next checkpoint, then restore",
           case.observed(images))


def test_shim_killed_during_a_gpu_dump_the_image_is_finished_and_restores(gpu_case: Case, record) -> None:
    case = gpu_case
    case.run()
    before = case.counter()
    images = case.dir / "images"
    case.slow("checkpoint", 2)
    case.kill_at(case.start(*case.checkpoint_args(images)), case.in_phase("dump"), "the dump")
    case.wait_delegate_gone()
    case.clear()
    assert case.status() == "gone" and case.manifest_completed(images) is False
    case.finished_by(*case.restore_args(images), said="marked complete")
    assert case.driver_states() == {"1": "RUNNING"}
    case.continues_from(before)
    record("shim SIGKILLed while the delegate dumps (GPU container); the next restore", case.observed(images))


def test_shim_killed_during_the_leave_running_device_restore(gpu_case: Case, record) -> None:
    case = gpu_case
    case.run()
    before = case.counter()
    case.driver(delay_s={"restore": 3})
    images = case.dir / "images"
    case.kill_at(case.start(*case.checkpoint_args(images, "--leave-running")),
                 case.calling("restore"), "the device restore")
    case.driver(delay_s={})
    assert case.driver_states() == {"1": "LOCKED"}  # the restore completed in the driver; the unlock never came
    case.finished_by(*case.checkpoint_args(case.dir / "second", "--leave-running"), said="marked complete")
    assert case.driver_states() == {"1": "RUNNING"} and case.status() == "running"
    assert case.manifest_completed(images)  # the first dump had completed: marked so by the recovery
    case.continues_from(before)
    record("shim SIGKILLed during --leave-running's device restore; the next checkpoint", case.observed(images))


def test_shim_killed_during_the_delegates_restore_the_next_verb_finishes_it(gpu_case: Case, record) -> None:
    case = gpu_case
    case.run()
    before = case.counter()
    images = case.dir / "images"
    status, line = case.checkpoint(images)
    assert status == 0, line
    case.slow("restore", 2)
    case.kill_at(case.start(*case.restore_args(images)),
                 case.in_phase("restore"), "the delegate's restore")
    case.wait_delegate_gone()
    case.clear()
    assert case.status() == "running" and case.driver_states() == {"1": "CHECKPOINTED"}  # restored, GPU not
    finished = case.finished_by(*case.checkpoint_args(case.dir / "second", "--leave-running"),
                                said="1 CUDA process(es) restored to the GPU and unlocked")
    assert case.driver_states() == {"1": "RUNNING"}
    case.continues_from(before)
    record("shim SIGKILLed during the delegate's restore (GPU container); the next checkpoint",
           case.observed(None, finished))


def test_shim_killed_during_the_device_restore_the_next_verb_finishes_it(gpu_case: Case, record) -> None:
    case = gpu_case
    case.run()
    before = case.counter()
    images = case.dir / "images"
    status, line = case.checkpoint(images)
    assert status == 0, line
    case.driver(delay_s={"restore": 3})
    case.kill_at(case.start(*case.restore_args(images)),
                 case.calling("restore"), "the device restore")
    case.driver(delay_s={})
    assert case.driver_states() == {"1": "LOCKED"} and case.journal()["phase"] == "gpu_restore"
    case.finished_by(*case.checkpoint_args(case.dir / "second", "--leave-running"),
                     said="restored to the GPU and unlocked")
    assert case.driver_states() == {"1": "RUNNING"}
    case.continues_from(before)
    record("shim SIGKILLed during the device restore; the next checkpoint", case.observed(images))


def test_gpuckpt_recover_finishes_a_journal_nobody_touches(runc_case: Case, record) -> None:
    case = runc_case
    case.run()
    before = case.counter()
    images = case.dir / "images"
    case.slow("checkpoint", 2)
    case.kill_at(case.start(*case.checkpoint_args(images)), case.in_phase("dump"), "the dump")
    case.wait_delegate_gone()
    case.clear()
    result = sh(GPUCKPT, "recover")
    assert f"{case.id}: finished the checkpoint" in result.stdout and case.journal() is None
    assert case.manifest_completed(images)
    status, line = case.restore(images)
    assert status == 0, line
    case.continues_from(before)
    record("shim SIGKILLed during the dump; `gpuckpt recover`", case.observed(images, result.stdout.strip()))


# -- failures the shim sees ----------------------------------------------------------------------


def test_the_delegate_failing_leaves_the_container_running(gpu_case: Case, record) -> None:
    case = gpu_case
    case.run()
    before = case.counter()
    case.fail("checkpoint")
    images = case.dir / "images"
    status, line = case.checkpoint(images)
    assert status == 3 and one_line(line) and "keeps running" in line
    assert case.status() == "running" and case.driver_states() == {"1": "RUNNING"}
    assert case.manifest_completed(images) is False
    case.clear()
    status, refused = case.restore(images)
    assert status != 0 and "never completed" in refused
    case.continues_from(before)
    record("the delegate's checkpoint exits 3", case.observed(images, line))


def test_criu_failing_on_a_file_it_cannot_dump(runc_case: Case, record) -> None:
    case = runc_case
    host_file = case.dir / "host-only"  # a host file the container holds open, from no mount of its
    host_file.write_text("x")
    fd = os.open(host_file, os.O_RDONLY)
    log = case.dir / "run.log"
    try:
        with open(os.devnull, "r+b") as null:
            started = subprocess.run([RUNTIME, "--root", RUNTIME_ROOT, "--log", str(log), "run", "-d",
                                      "--preserve-fds", "1", case.id], stdin=null, stdout=null, stderr=null,
                                     cwd=case.bundle, pass_fds=(fd,), timeout=120)
    finally:
        os.close(fd)
    assert started.returncode == 0, log.read_text()
    before = case.counter()
    images = case.dir / "images"
    status, line = case.checkpoint(images)
    assert status != 0 and one_line(line)
    assert case.status() == "running" and case.manifest_completed(images) is False
    case.continues_from(before)
    record("CRIU cannot dump an open file (a host file passed in, from no mount of the container)",
           case.observed(images, line))


def test_the_image_filesystem_filling_up_mid_dump(cpu_case: Case, record) -> None:
    case = cpu_case
    case.run()
    before = case.counter()
    images = case.dir / "small"
    images.mkdir()
    # the counter holds 16 MiB; mode 0700: a tmpfs is made 1777, where the shim refuses to sign what others may add
    sh("mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "gpuckpt-fault", str(images))
    try:
        status, line = case.checkpoint(images)
        assert status != 0 and one_line(line)
        assert case.status() == "running" and case.manifest_completed(images) is False
        status, refused = case.restore(images)
        assert status != 0 and "never completed" in refused
        case.continues_from(before)
        record("the image directory's filesystem (a 4 MiB tmpfs) fills up mid-dump", case.observed(images, line))
    finally:
        sh("umount", str(images), check=False)


def test_a_lock_timeout_leaves_the_container_running(gpu_case: Case, record) -> None:
    case = gpu_case
    case.run()
    case.driver(fail={"lock": "CUDA_ERROR_TIMEOUT"})
    images = case.dir / "images"
    status, line = case.checkpoint(images)
    assert status != 0 and one_line(line) and "CUDA_ERROR_TIMEOUT" in line and "keeps running" in line
    assert case.status() == "running" and case.driver_states() == {"1": "RUNNING"} and case.journal() is None
    record("the CUDA lock times out", case.observed(images, line))


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
def test_a_damaged_image_is_refused_before_anything_is_created(runc_case: Case, record, damage: str) -> None:
    case = runc_case
    case.run()
    images = case.dir / "images"
    status, line = case.checkpoint(images)
    assert status == 0, line
    pages = sorted(images.glob("pages-*.img"), key=lambda path: path.stat().st_size)[-1]
    if damage == "truncated":
        os.truncate(pages, pages.stat().st_size // 2)
    else:
        core = images / "core-1.img"
        data = bytearray(core.read_bytes())
        data[len(data) // 2] ^= 0xFF
        core.write_bytes(bytes(data))
    status, refused = case.restore(images)
    assert status != 0 and one_line(refused) and case.status() == "gone"
    how = "a pages file cut in half" if damage == "truncated" else "a byte of core-1.img flipped"
    record(f"restore from a {damage} image ({how})", case.observed(images, refused))


def test_a_second_checkpoint_of_the_container_at_once_is_refused(cpu_case: Case, record) -> None:
    case = cpu_case
    case.run()
    before = case.counter()
    case.slow("checkpoint", 2)
    first = case.start(*case.checkpoint_args(case.dir / "first"))
    deadline = time.monotonic() + 30
    while not case.in_phase("dump")() and time.monotonic() < deadline:
        time.sleep(0.02)
    status, line = case.checkpoint(case.dir / "second", "--leave-running")
    assert status == 1 and one_line(line) and "another gpuckpt process" in line and "nothing was touched" in line
    assert first.wait(timeout=120) == 0
    case.clear()
    status, restored = case.restore(case.dir / "first")
    assert status == 0, restored
    case.continues_from(before)
    record("a second checkpoint of the same container while one dumps", case.observed(case.dir / "first", line))


@pytest.mark.parametrize("race", ["kill", "delete --force"])
def test_a_checkpoint_racing_kill_or_rm_leaves_the_last_good_checkpoint(runc_case: Case, record, race: str) -> None:
    case = runc_case
    case.run()
    good = case.dir / "good"
    status, line = case.checkpoint(good, "--leave-running")
    assert status == 0, line
    before = case.counter()
    case.slow("checkpoint", 2)
    racing = case.start(*case.checkpoint_args(case.dir / "raced"))
    deadline = time.monotonic() + 30
    while not case.in_phase("dump")() and time.monotonic() < deadline:
        time.sleep(0.02)
    racer = ["kill", case.id, "KILL"] if race == "kill" else ["delete", "--force", case.id]
    sh(RUNTIME, "--root", RUNTIME_ROOT, *racer)
    assert racing.wait(timeout=120) != 0
    line = case.last_error()
    assert one_line(line) and case.journal() is None
    case.clear()
    case.remove()
    status, restored = case.restore(good)
    assert status == 0, restored
    after = case.counter()
    assert after.token == before.token  # the last good checkpoint's workload
    record(f"`runc {race}` of the container while its checkpoint dumps", case.observed(case.dir / "raced", line))


@pytest.mark.parametrize("dump_done", [False, True], ids=["before-the-dump", "after-the-dump"])
def test_a_reboot_mid_checkpoint(runc_case: Case, record, dump_done: bool) -> None:
    """Simulated: the shim (and, before the dump, its delegate) die with the node; the journal on disk says
    another boot; the container's processes and runc's state under /run are gone; the images stay."""
    case = runc_case
    case.run()
    good = case.dir / "good"
    status, line = case.checkpoint(good, "--leave-running")
    assert status == 0, line
    before = case.counter()
    images = case.dir / "images"
    case.slow("checkpoint", 2)
    shim = case.start(*case.checkpoint_args(images))
    case.kill_at(shim, case.in_phase("dump"), "the dump")
    if dump_done:
        case.wait_delegate_gone()
    else:
        os.kill(case.journal()["delegate_pid"], signal.SIGKILL)  # the node went down before CRIU ran
    case.clear()
    journal_path = case.journal_path
    left = json.loads(journal_path.read_text())
    left["boot_id"] = "00000000-0000-4000-8000-000000000000"
    journal_path.write_text(json.dumps(left))
    case.remove()
    result = sh(GPUCKPT, "recover")
    assert "before the reboot" in result.stdout and case.journal() is None
    assert case.manifest_completed(images) is dump_done
    status, line = case.restore(images if dump_done else good)
    assert status == 0, line
    after = case.counter()
    assert after.token == before.token
    if not dump_done:
        case.remove()
        status, refused = case.restore(images)
        assert status != 0 and "never completed" in refused
    record(f"the node reboots mid-checkpoint, {'after' if dump_done else 'before'} CRIU's dump",
           case.observed(images, result.stdout.strip()))


# -- a peer that never comes ----------------------------------------------------------------------


@contextlib.contextmanager
def silent_page_server() -> Iterator[int]:
    """A port that takes connections and never reads them: CRIU's dump to it blocks, as it does for a page server
    or lazy restore that never comes; its port."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def started_by(shim: subprocess.Popen, name: str, timeout_s: float = 60) -> dict[int, int]:
    """The shim's descendants (pid -> start time) once one of them is `name` (criu): what it must not leave."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        below = descendants(shim.pid)[1:]
        if any(name in _command_line(pid) for pid in below):  # the node's criu may run through its own ld.so
            return {pid: started for pid in below if (started := start_time(pid)) is not None}
        assert shim.poll() is None, f"the shim ended ({shim.returncode}) before {name} started"
        time.sleep(0.05)
    raise AssertionError(f"no {name} under the shim within {timeout_s} s")


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def still_there(processes: dict[int, int]) -> list[int]:
    return [pid for pid, started in processes.items() if live_start_time(pid) == started]


def test_sigterm_to_a_checkpoint_waiting_on_a_page_server_leaves_no_criu(runc_case: Case, record) -> None:
    case = runc_case  # crun has no --page-server
    case.run()
    before = case.counter()
    with silent_page_server() as port:
        shim = case.start(*case.checkpoint_args(case.dir / "images", "--page-server", f"127.0.0.1:{port}"))
        children = started_by(shim, "criu")
        time.sleep(2)  # criu connected and waiting on the silent peer
        assert shim.poll() is None, "the dump ended without its page server"
        shim.send_signal(signal.SIGTERM)
        status = shim.wait(timeout=30)  # the bound: REAP_WAIT_S and the rollback, well within
        left = still_there(children)
    assert status != 0 and not left, f"exit {status}; left running: {left}"
    assert case.status() == "running"
    case.continues_from(before)
    record("SIGTERM to a checkpoint whose page server never answers",
           case.observed(case.dir / "images", case.last_error()) + "; no runc or criu left")


def test_a_page_server_that_never_answers_ends_the_checkpoint_at_peer_timeout_s(runc_case: Case, record) -> None:
    case = runc_case
    case.run()
    before = case.counter()
    with silent_page_server() as port, configured_delegate(str(case.delegate), "[criu]\npeer_timeout_s = 3\n"):
        shim = case.start(*case.checkpoint_args(case.dir / "images", "--page-server", f"127.0.0.1:{port}"))
        children = started_by(shim, "criu")
        status = shim.wait(timeout=60)
        left = still_there(children)
    line = case.last_error()
    assert status != 0 and not left, f"exit {status}; left running: {left}"
    assert one_line(line) and "criu.peer_timeout_s" in line and "within 3 s" in line, line
    assert case.status() == "running"
    case.continues_from(before)
    record("a page server that takes the connection and never answers (criu.peer_timeout_s = 3)",
           case.observed(case.dir / "images", line) + "; no runc or criu left")


def test_a_dump_past_dump_timeout_s_is_ended_and_the_container_keeps_running(runc_case: Case, record) -> None:
    case = runc_case
    case.run()
    before = case.counter()
    case.slow("checkpoint", 120)  # a dump stuck (the delegate sleeps first): nothing is frozen yet
    with configured_delegate(str(case.delegate), "[criu]\ndump_timeout_s = 3\n"):
        began = time.monotonic()
        shim = case.start(*case.checkpoint_args(case.dir / "images"))
        children = started_by(shim, "sleep")
        status = shim.wait(timeout=60)
        took_s = time.monotonic() - began
        left = still_there(children)
    line = case.last_error()
    assert status != 0 and not left and took_s < 30, f"exit {status} after {took_s:.1f} s; left running: {left}"
    assert one_line(line) and "within 3 s (criu.dump_timeout_s)" in line, line
    assert case.status() == "running"
    case.continues_from(before)
    record("a dump that never ends (criu.dump_timeout_s = 3)", case.observed(case.dir / "images", line))


# -- one ID under two roots -----------------------------------------------------------------------


def test_one_id_under_two_roots_is_checkpointed_while_the_other_is_at_work(runc_case: Case, record,
                                                                           tmp_path: Path) -> None:
    """runc keys its containers by --root and ID: a checkpoint of ID under root B goes on while the shim works on
    ID under root A (its dump waiting on a page server), where one lock per ID refused it ("another gpuckpt
    process ... is working on it")."""
    case = runc_case
    case.run()
    other_root = f"{RUNTIME_ROOT}-parity-b"
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other_bundle = make_bundle(case.rootfs, other_dir)
    spec = json.loads((other_bundle / "config.json").read_text())
    spec["linux"]["cgroupsPath"] = f"/gpuckpt-parity-b-{os.getpid()}"  # runc's default, /ID, is the other's
    (other_bundle / "config.json").write_text(json.dumps(spec))
    in_other = [RUNTIME, "--root", other_root, "--log", str(other_dir / "shim.log"), "--log-format", "json"]
    with open(os.devnull, "r+b") as null:
        started = subprocess.run([*in_other, "run", "-d", case.id], stdin=null, stdout=null, stderr=null,
                                 cwd=other_bundle, timeout=120)
    try:
        assert started.returncode == 0, (other_dir / "shim.log").read_text()
        with silent_page_server() as port:
            holder = case.start(*case.checkpoint_args(case.dir / "held", "--page-server", f"127.0.0.1:{port}"))
            children = started_by(holder, "criu")  # root A's checkpoint holds its lock, waiting on its peer
            images = other_dir / "images"
            other = sh(*in_other, "checkpoint", "--image-path", str(images), case.id, check=False, cwd=other_bundle)
            holder.send_signal(signal.SIGTERM)
            holder.wait(timeout=30)
            left = still_there(children)
        assert other.returncode == 0, other.stderr
        assert json.loads((images / "gpuckpt-manifest.json").read_text())["dump_completed"] is True
        assert not left and case.status() == "running"
    finally:
        sh(RUNTIME, "--root", other_root, "delete", "-f", case.id, check=False)
    record("a checkpoint of the same ID under another --root while one is at work",
           f"the other root's checkpoint completed; {case.observed(case.dir / 'held')}")
