"""`gpuckptd`: the node service (systemd Type=notify).

Starts by restoring what a drain left (service.restore_at_start), then serves the local API
(`gpuckpt drain`, `gpuckpt service ...`), pets systemd's watchdog, watches for preemption
notices (service/preemption.py: URL, file, SIGUSR1), takes periodic checkpoints and suspends
idle GPU containers (service/schedule.py), and on SIGTERM (the node
shutting down, `systemctl stop`) drains every recorded container before it exits
(service.drain_on_stop).
"""

from __future__ import annotations

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
from .pool import Pool
from .preemption import PreemptionWatch
from .schedule import Schedule
from .server import Server
from .systemd import log, notify, watchdog_interval_s

TICK_S = 1.0  # how often the service looks at its watchers (preemption, schedule) and the watchdog


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        sys.stderr.write("gpuckptd: takes no arguments (configuration: /etc/gpuckpt/config.toml, [service])\n")
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    preemption_signalled = threading.Event()
    signal.signal(signal.SIGUSR1, lambda signum, frame: preemption_signalled.set())
    try:
        everything = load_config()
        config = everything.service
        operations = Operations(config)
        if pending_journals():  # a shim killed mid-checkpoint (or the node with it): finished before anything else
            recover_all(log)
        if config.restore_at_start and (waiting := operations.status().drained):
            notify(f"STATUS=restoring {len(waiting)} drained container(s)")
            result = operations.restore(unheard)
            log(result.message)
        pool = Pool(everything.pool)  # the warm pool (service/pool.py): ticked with the watchers
        server = Server(config.socket, operations, pool)
        preemption = PreemptionWatch(config, operations, preemption_signalled)
        schedule = Schedule(config, operations)
    except GpuckptError as error:
        log(f"cannot start: {error}")
        return 1
    server.start()
    notify("READY=1", f"STATUS=serving {config.socket}")
    log(f"ready on {config.socket}")
    _watch(stop, preemption, schedule, pool)
    notify("STOPPING=1")
    if config.drain_on_stop:
        notify("STATUS=draining before stopping")
        log(operations.drain(unheard, wait=True).message)
    server.close()
    log("stopped")
    return 0


def _watch(stop: threading.Event, preemption: PreemptionWatch, schedule: Schedule, pool: Pool) -> None:
    """Until `stop`: each tick, systemd's watchdog petted when due and the watchers looked at."""
    interval = watchdog_interval_s()
    next_pet = 0.0
    while not stop.wait(TICK_S):
        if interval and time.monotonic() >= next_pet:
            notify("WATCHDOG=1")
            next_pet = time.monotonic() + interval
        schedule.paused = pool.paused = preemption.handled  # after a notice, nothing but its drain
        for watch in (preemption.check, schedule.check, pool.check):
            try:
                watch()
            except GpuckptError as error:  # reported; the service goes on
                log(str(error))
            except Exception as error:  # noqa: BLE001 -- a bug, or an input no check foresaw: logged, and the service goes on
                log(f"internal error in {getattr(watch, '__qualname__', 'a watcher')}: {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(main())
