"""`gpuckpt drain` and `gpuckpt service status|restore`: gpuckptd's operations, asked through its socket.

One line per container as it goes (`--json`: the service's events as they come), and on a
terminal a bar over the containers below them (cli.progress); exit status 1 if any container failed.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from ..errors import UsageError
from ..node.config import load_config
from ..node.container_record import container_label
from ..service.api import ContainerEvent, Event, Plan, Request, Result, Status
from ..service.client import request
from .progress import bytes_done, container_bar, line_above


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    drain = commands.add_parser("drain", help="checkpoint every recorded container into the archive directory "
                                              "(gpuckptd restores them when it starts)")
    drain.add_argument("--deadline", type=float, metavar="SECONDS",
                       help="start no checkpoint after this (smallest containers go first)")
    drain.add_argument("--json", action="store_true", help="the service's events, one JSON object a line")
    drain.set_defaults(handler=run, op="drain")
    service = commands.add_parser("service", help="ask gpuckptd")
    verbs = service.add_subparsers(dest="service_command", required=True, metavar="VERB")
    for verb, text in (("status", "the recorded containers and the drained ones waiting"),
                       ("restore", "restore what a drain left, now")):
        parser = verbs.add_parser(verb, help=text)
        parser.add_argument("--json", action="store_true", help="the service's events, one JSON object a line")
        parser.set_defaults(handler=run, op=verb, deadline=None)


def _line(event: Event) -> str:
    if isinstance(event, ContainerEvent):
        figures = f" ({event.bytes / 2**20:.1f} MiB, {event.seconds:.1f} s)" if event.state == "done" else ""
        detail = f": {event.message}" if event.message else ""
        named = container_label(event.name, event.id)
        return f"{event.phase} {event.state:<7} {named} ({event.engine}){figures}{detail}"
    if isinstance(event, Plan):
        held = "of host memory now" if event.phase == "checkpoint" else "of checkpoints"
        return f"{event.phase} {event.containers} containers ({event.bytes / 2**20:.1f} MiB {held})"
    if isinstance(event, Status):
        busy = f"; busy: {event.busy}" if event.busy else ""
        return (f"recorded: {len(event.recorded)} {' '.join(cid[:12] for cid in event.recorded)}\n"
                f"drained, waiting: {len(event.drained)} {' '.join(cid[:12] for cid in event.drained)}{busy}")
    return event.message


def run(options: argparse.Namespace) -> int:
    if options.deadline is not None and options.deadline <= 0:
        raise UsageError(f"--deadline {options.deadline:g}: give a number of seconds above 0")
    events = request(load_config().service.socket, Request(op=options.op, deadline_s=options.deadline))
    return 0 if report(events, options.json) else 1


def report(events: Iterable[Event], as_json: bool) -> bool:
    """Each event as its line on stdout (`as_json`: as the service sent it) and, from the first
    (the Plan: how many containers), the bar below them; whether all went well."""
    ok, bar, moved_bytes, total_bytes = True, None, 0, None
    try:
        for event in events:
            if bar is None and isinstance(event, Plan | ContainerEvent):  # an older gpuckptd sends no Plan
                plan = event if isinstance(event, Plan) else None
                total_bytes = plan.bytes if plan and plan.phase == "restore" else None  # a drain's is a floor
                bar = container_bar(event.phase, plan.containers if plan else None)
                bytes_done(bar, 0, total_bytes)
            if isinstance(event, Result) and bar is not None:
                bar.close()  # the bar's last state stays, above the result
            line_above(bar, event.model_dump_json() if as_json else _line(event))
            if isinstance(event, ContainerEvent) and event.state != "started" and bar is not None:
                moved_bytes += event.bytes
                bytes_done(bar, moved_bytes, total_bytes)
                bar.update()
            if isinstance(event, Result):
                ok = ok and event.ok
            elif isinstance(event, ContainerEvent) and event.state == "failed":
                ok = False
    finally:
        if bar is not None:
            bar.close()  # closing twice is nothing
    return ok
