"""On a GPU machine: a CUDA process stopped (SIGSTOP) just before the shim's lock, and one stopped
between lock and checkpoint, each through cuda/engine.py's watchdog against the real driver.

Expected: the lock on the stopped process ignores its timeout until the watchdog continues the
process (SIGCONT); the lock then completes, the session rolls back (unlocked), names the PID and
stops the process again; continued, the process computes on. Prints one JSON object.
Run: PYTHONPATH=<dir holding gpuckpt> python3 integration/gpu/stopped_lock.py
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import time

from gpuckpt.cuda import engine
from gpuckpt.cuda.driver import ProcessState, load_driver
from gpuckpt.errors import GpuCheckpointError
from gpuckpt.host.procfs import is_stopped

WORKER = (
    "import sys, time, torch\n"
    "x = torch.zeros(1 << 20, device='cuda')\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    x += 1; torch.cuda.synchronize(); print(int(x[0].item()), flush=True); time.sleep(0.05)\n"
)
LOCK_TIMEOUT_MS = 1500


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    while not is_stopped(pid):
        time.sleep(0.001)


def progress(worker: subprocess.Popen) -> int:
    """The worker's counter after it ran a little (it must still compute on the GPU)."""
    os.kill(worker.pid, signal.SIGCONT)
    line = ""
    for _ in range(5):
        line = worker.stdout.readline().strip()
    return int(line)


def scenario(driver, worker: subprocess.Popen, when: str) -> dict:
    session = engine.CudaSession(driver, [worker.pid])
    log(f"{when}: state {driver.state(worker.pid).name}")
    started = time.monotonic()
    outcome: dict = {"when": when}
    try:
        if when == "before lock":
            stop(worker.pid)
            session.lock(LOCK_TIMEOUT_MS)
        else:
            session.lock(LOCK_TIMEOUT_MS)
            stop(worker.pid)
            session.checkpoint()
        outcome["error"] = None
    except GpuCheckpointError as error:
        outcome["error"] = str(error)
    outcome["call_s"] = round(time.monotonic() - started, 3)
    log(f"{when}: call returned after {outcome['call_s']} s: {outcome['error']}")
    outcome["state_after_call"] = driver.state(worker.pid).name
    outcome["rollback_leftovers"] = session.rollback()
    log(f"{when}: rolled back: {outcome['rollback_leftovers']}")
    time.sleep(0.2)
    outcome["stopped_again"] = is_stopped(worker.pid)
    outcome["counter_after"] = progress(worker)  # continues it: GetState also waits on a stopped process
    outcome["state_after_rollback"] = driver.state(worker.pid).name
    return outcome


def state_of_a_stopped_process(driver, worker: subprocess.Popen) -> dict:
    """The shim's first driver call (is it running?) on a process stopped beforehand."""
    stop(worker.pid)
    session = engine.CudaSession(driver, [worker.pid])
    started = time.monotonic()
    try:
        session.require_running()
        error = None
    except GpuCheckpointError as refused:
        error = str(refused)
    outcome = {"when": "state query", "error": error, "call_s": round(time.monotonic() - started, 3),
               "stopped_again": is_stopped(worker.pid)}
    log(f"state query: {outcome}")
    outcome["counter_after"] = progress(worker)
    outcome["state_after_rollback"] = driver.state(worker.pid).name
    outcome["rollback_leftovers"] = []
    return outcome


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def main() -> int:
    faulthandler.dump_traceback_later(150, exit=True)  # a hang shows where it is
    engine.WATCHDOG_MARGIN_S = 1.0
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        log("worker ready")
        driver = load_driver()
        results = [state_of_a_stopped_process(driver, worker)]
        results += [scenario(driver, worker, when) for when in ("before lock", "between lock and checkpoint")]
        ok = all(r["state_after_rollback"] == ProcessState.RUNNING.name and not r["rollback_leftovers"]
                 for r in results)
        print(json.dumps({"lock_timeout_ms": LOCK_TIMEOUT_MS, "margin_s": engine.WATCHDOG_MARGIN_S,
                          "results": results, "ok": ok}, indent=2))
        return 0 if ok else 1
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        worker.kill()
        worker.wait()


if __name__ == "__main__":
    sys.exit(main())
