"""`gpuckptd`: the node service (systemd Type=notify).

Starts by restoring what a drain left (service.restore_at_start), then serves the local API
(`gpuckpt drain`, `gpuckpt service ...`), pets systemd's watchdog, watches for preemption
notices (service/preemption.py: URL, file, SIGUSR1), takes periodic checkpoints and suspends
idle GPU containers (service/schedule.py), and on SIGTERM (the node
shutting down, `systemctl stop`) drains every recorded container before it exits
(service.drain_on_stop).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from types import FrameType

from ..errors import GpuckptError
from ..node.config import load_config
from ..node.journal import pending_journals
from ..shim.recover import recover_all
from .operations import Operations, unheard
from .preemption import PreemptionWatch
from .schedule import Schedule
from .server import Server
from .systemd import log, notify, watchdog_interval_s

TICK_S = 1.0  # how often the service looks at its watchers (preemption, schedule) and the watchdog


def build_parser() -> argparse.ArgumentParser:
    """gpuckptd's command line (its manual page and completion are generated from it: cli/manual.py)."""
    return argparse.ArgumentParser(
        prog="gpuckptd",
        description="The node service of gpuckpt: it restores what a drain left, serves gpuckpt drain and gpuckpt "
                    "service, watches for preemption notices (a URL, a file, SIGUSR1), takes periodic checkpoints, "
                    "suspends idle GPU containers, and on SIGTERM drains every recorded container before it exits. "
                    "systemd starts it (gpuckptd.service); its settings are the [service] table of "
                    "/etc/gpuckpt/config.toml.")


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)  # --help; anything else is refused (rc 2)
    stop = threading.Event()

    def on_signal(signum: int, _: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    preemption_signalled = threading.Event()
    signal.signal(signal.SIGUSR1, lambda signum, frame: preemption_signalled.set())
    try:
        config = load_config().service
        operations = Operations(config)
        if pending_journals():  # a shim killed mid-checkpoint (or the node with it): finished before anything else
            recover_all(log)
        if config.restore_at_start and (waiting := operations.status().drained):
            notify(f"STATUS=restoring {len(waiting)} drained container(s)")
            result = operations.restore(unheard)
            log(result.message)
        server = Server(config.socket, operations)
        preemption = PreemptionWatch(config, operations, preemption_signalled)
        schedule = Schedule(config, operations)
    except GpuckptError as error:
        log(f"cannot start: {error}")
        return 1
    server.start()
    notify("READY=1", f"STATUS=serving {config.socket}")
    log(f"ready on {config.socket}")
    _watch(stop, preemption, schedule)
    notify("STOPPING=1")
    if config.drain_on_stop:
        notify("STATUS=draining before stopping")
        log(operations.drain(unheard, wait=True).message)
    server.close()
    log("stopped")
    return 0


def _watch(stop: threading.Event, preemption: PreemptionWatch, schedule: Schedule) -> None:
    """Until `stop`: each tick, systemd's watchdog petted when due and the watchers looked at."""
    interval = watchdog_interval_s()
    next_pet = 0.0
    while not stop.wait(TICK_S):
        if interval and time.monotonic() >= next_pet:
            notify("WATCHDOG=1")
            next_pet = time.monotonic() + interval
        schedule.paused = preemption.handled  # after a notice, nothing but its drain
        for watch in (preemption.check, schedule.check):
            try:
                watch()
            except GpuckptError as error:  # reported; the service goes on
                log(str(error))
            except Exception as error:  # noqa: BLE001 -- a bug, or an input no check foresaw: logged, and the service goes on
                log(f"internal error in {getattr(watch, '__qualname__', 'a watcher')}: {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(main())
