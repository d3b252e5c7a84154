"""`gpuckptd`: the node service, in the foreground (systemd's Type=notify, or a terminal or another
supervisor where systemd is not PID 1).

Starts by restoring what a drain left (service.restore_at_start), then serves the local API
(`gpuckpt drain`, `gpuckpt service ...`), pets systemd's watchdog, watches for preemption
notices (service/preemption.py: URL, file, SIGUSR1), takes periodic checkpoints and suspends
idle GPU containers (service/schedule.py). SIGTERM or SIGINT stops it; with --drain-on-stop (the
systemd unit's command: the node shutting down) it first drains every recorded container, unless
service.drain_on_stop is false. Without it a stop drains nothing: `gpuckpt drain` drains.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from types import FrameType

from .. import __version__
from ..errors import GpuckptError
from ..node.config import load_config
from ..node.journal import pending_journals
from ..node.paths import CONFIG_PATH_ENV, DEFAULT_CONFIG_PATH
from ..shim.recover import recover_all
from .operations import Operations, unheard
from .pool import Pool
from .preemption import PreemptionWatch
from .schedule import Schedule
from .server import Server
from .systemd import log, notify, watchdog_interval_s

NOT_ROOT_STATUS = 6  # gpuckpt's status for it (docs/cli-output.md)
TICK_S = 1.0  # how often the service looks at its watchers (preemption, schedule) and the watchdog


def build_parser() -> argparse.ArgumentParser:
    """gpuckptd's command line (its manual page and completion are generated from it: cli/manual.py)."""
    parser = argparse.ArgumentParser(
        prog="gpuckptd", allow_abbrev=False, description=(
            "gpuckpt's node service. Restores what a drain left, then serves `gpuckpt drain` and `gpuckpt service` "
            "on service.socket, drains on a preemption notice, takes periodic checkpoints and suspends idle GPU "
            "containers, as the [service] section of the configuration says. It runs in the foreground: under "
            "systemd (gpuckptd.service, Type=notify) or, where systemd is not PID 1, in a terminal or under "
            "another supervisor; it logs to the journal, or to stderr outside systemd."),
        epilog=(f"Configuration: ${CONFIG_PATH_ENV} or {DEFAULT_CONFIG_PATH}. Signals: SIGTERM or SIGINT (Ctrl-C) "
                "stops it, draining first only with --drain-on-stop; SIGUSR1 is a preemption notice. `gpuckpt "
                "service status` shows its state, `gpuckpt service reset` clears a preemption."))
    parser.add_argument("--version", action="version", version=f"gpuckptd {__version__}")
    parser.add_argument("--drain-on-stop", action="store_true",
                        help="on SIGTERM or SIGINT, drain every recorded container before exiting (the node shutting "
                             "down: the systemd unit passes it; service.drain_on_stop = false overrides it)")
    return parser


def main(argv: list[str] | None = None) -> int:
    options = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:  # its state, the engines and its socket are root's: one line, not PermissionError's trace
        log("cannot start: must be root (run it with sudo)")
        return NOT_ROOT_STATUS
    stop = threading.Event()

    def on_signal(signum: int, _: FrameType | None) -> None:
        _set_from_handler(stop)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    preemption_signalled = threading.Event()
    signal.signal(signal.SIGUSR1, lambda signum, frame: _set_from_handler(preemption_signalled))
    try:
        everything = load_config()
        config = everything.service
        drains_on_stop = options.drain_on_stop and config.drain_on_stop
        operations = Operations(config)
        if pending_journals():  # a shim killed mid-checkpoint (or the node with it): finished before anything else
            recover_all(log)
        if config.restore_at_start and (waiting := operations.status().drained):
            notify(f"STATUS=restoring {len(waiting)} drained container(s)")
            result = operations.restore(unheard)
            log(result.message)
        pool = Pool(everything.pool)  # the warm pool (service/pool.py): ticked with the watchers
        preemption = PreemptionWatch(config, operations, preemption_signalled)
        schedule = Schedule(config, operations)
        server = Server(config.socket, operations, preemption, schedule, drains_on_stop=drains_on_stop, pool=pool)
    except GpuckptError as error:
        log(f"cannot start: {error}")
        return 1
    server.start()
    notify("READY=1", f"STATUS=serving {config.socket}")
    log(f"ready on {config.socket}; a stop " + (
        "drains every recorded container first (--drain-on-stop)" if drains_on_stop else
        "drains nothing (`gpuckpt drain` drains; service.drain_on_stop = false)" if options.drain_on_stop else
        "drains nothing (`gpuckpt drain` drains; gpuckptd --drain-on-stop drains at stop)"))
    _watch(stop, preemption, schedule, pool)
    notify("STOPPING=1")
    if drains_on_stop:
        notify("STATUS=draining before stopping")
        log(operations.drain(unheard, wait=True).message)
    server.close()
    log("stopped")
    return 0


def _set_from_handler(event: threading.Event) -> None:
    """`event` set from a signal handler, by another thread: the handler runs in the main thread between two of
    its steps, which may be inside `stop.wait()` holding the event's own lock, and Event.set() takes that lock
    again (a SIGINT right after READY=1 hung gpuckptd that way, now and then)."""
    threading.Thread(target=event.set, name="signal", daemon=True).start()


def _watch(stop: threading.Event, preemption: PreemptionWatch, schedule: Schedule, pool: Pool) -> None:
    """Until `stop`: each tick, systemd's watchdog petted when due and the watchers looked at."""
    interval = watchdog_interval_s()
    next_pet = 0.0
    while not stop.wait(TICK_S):
        if interval and time.monotonic() >= next_pet:
            notify("WATCHDOG=1")
            next_pet = time.monotonic() + interval
        schedule.paused = "a preemption is pending (gpuckpt service reset clears it)" if preemption.pending else ""
        pool.paused = preemption.pending  # after a notice, nothing but its drain
        for watch in (preemption.check, schedule.check, pool.check):
            try:
                watch()
            except GpuckptError as error:  # reported; the service goes on
                log(str(error))
            except Exception as error:  # noqa: BLE001 -- a bug, or an input no check foresaw: logged, and the service goes on
                log(f"internal error in {getattr(watch, '__qualname__', 'a watcher')}: {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(main())
