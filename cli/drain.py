"""`gpuckpt drain` and `gpuckpt service status|restore`: gpuckptd's operations, asked through its socket.

One line per container as it goes (`--json`: the service's events as they come); exit status 1
if any container failed.
"""

from __future__ import annotations

import argparse

from gpuckpt.errors import UsageError
from gpuckpt.node.config import load_config
from gpuckpt.oci.service_api import ContainerEvent, Event, Request, Result, Status
from gpuckpt.service.client import request


def add_parser(commands: argparse._SubParsersAction) -> None:
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
        return f"{event.phase} {event.state:<7} {event.id[:12]} ({event.engine}){figures}{detail}"
    if isinstance(event, Status):
        busy = f"; busy: {event.busy}" if event.busy else ""
        return (f"recorded: {len(event.recorded)} {' '.join(cid[:12] for cid in event.recorded)}\n"
                f"drained, waiting: {len(event.drained)} {' '.join(cid[:12] for cid in event.drained)}{busy}")
    return event.message


def run(options: argparse.Namespace) -> int:
    if options.deadline is not None and options.deadline <= 0:
        raise UsageError(f"--deadline {options.deadline:g}: give a number of seconds above 0")
    ok = True
    for event in request(load_config().service.socket, Request(op=options.op, deadline_s=options.deadline)):
        print(event.model_dump_json() if options.json else _line(event), flush=True)
        if isinstance(event, Result):
            ok = ok and event.ok
        elif isinstance(event, ContainerEvent) and event.state == "failed":
            ok = False
    return 0 if ok else 1
