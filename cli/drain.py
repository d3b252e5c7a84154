"""`gpuckpt drain` and `gpuckpt service status|restore|reset`: gpuckptd's operations, asked through its socket.

One line per container as it goes (`--json`: the service's events as they come), and on a
terminal a bar over the containers below them (cli.progress); exit status 1 if any container failed.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence

from ..errors import NotFoundError, ServiceRefusedError, UsageError
from ..node.config import load_config
from ..node.container_record import container_label
from ..service.api import ContainerEvent, Event, Periodic, Plan, Preemption, Request, Result, Scheduled, Status
from ..service.client import request
from .output import counted
from .progress import bytes_done, container_bar, line_above


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    drain = commands.add_parser("drain", help="checkpoint every recorded container into the archive directory "
                                              "(gpuckptd restores them when it starts)")
    drain.add_argument("containers", nargs="*", metavar="CONTAINER",
                       help="only these recorded containers (name, ID or a unique ID prefix, as gpuckpt service "
                            "status lists them), and the other members of a group one is in; default: all")
    drain.add_argument("--deadline", type=float, metavar="SECONDS",
                       help="start no checkpoint after this (smallest containers go first)")
    drain.add_argument("--json", action="store_true", help="the service's events, one JSON object a line")
    drain.set_defaults(handler=run, op="drain")
    service = commands.add_parser("service", help="ask gpuckptd")
    verbs = service.add_subparsers(dest="service_command", required=True, metavar="VERB")
    for verb, text in (("status", "the recorded containers and their periodic checkpoints, the drained ones "
                                  "waiting, the preemption watch"),
                       ("restore", "restore what a drain left, now"),
                       ("reset", "clear a preemption whose drain has ended: notices are watched and periodic "
                                 "checkpoints taken again, without a restart")):
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
        return f"{event.phase} {counted(event.containers, 'container')} ({event.bytes / 2**20:.1f} MiB {held})"
    if isinstance(event, Status):
        return _status_lines(event)
    return event.message if isinstance(event, Result) else event.model_dump_json()  # the pool's: cli/pool.py


def _status_lines(status: Status) -> str:
    lines = [_preemption_line(status.preemption)] if status.preemption else []
    periodic = status.periodic.containers if status.periodic else []
    scheduled = {item.id: item for item in periodic}
    def named(ids: list[str]) -> str:  # as `podman ps` names them: the name and the short ID
        return ", ".join(container_label(status.names.get(cid), cid) for cid in ids)

    lines.append(f"recorded: {len(status.recorded)}" + ("" if status.periodic else f" {named(status.recorded)}"))
    if status.periodic:
        lines.append(_periodic_line(status.periodic))
        for cid in status.recorded:
            lines.append(f"  {named([cid])}" + (_scheduled(scheduled[cid]) if cid in scheduled else ""))
    lines.append(f"drained, waiting: {len(status.drained)} {named(status.drained)}".rstrip())
    if status.drains_on_stop is not None:
        lines.append("on stop: " + ("drains every recorded container" if status.drains_on_stop
                                    else "drains nothing (gpuckpt drain drains)"))
    if status.busy:
        lines.append(f"busy: {status.busy}")
    return "\n".join(lines)


def _preemption_line(preemption: Preemption) -> str:
    if preemption.state == "watching":
        return f"preemption: watching {', '.join(preemption.sources)}"
    drain = f"; {preemption.drain}" if preemption.drain else ""
    cleared = "; `gpuckpt service reset` clears it" if preemption.state == "drained" else ""
    return (f"preemption: {preemption.state}: notice at {preemption.noticed_at} from {preemption.source}, the node "
            f"goes at {preemption.deadline_at}{drain}{cleared}")


def _periodic_line(periodic: Periodic) -> str:
    every = f"every {periodic.every_min:g} min" if periodic.every_min else "only containers annotated " \
        "io.gpuckpt.checkpoint-every"
    upcoming = sorted(item.next_at for item in periodic.containers if item.next_at)
    state = f"paused: {periodic.paused}" if periodic.paused else f"next {upcoming[0]}" if upcoming else "none due"
    return f"periodic checkpoints: {every}; {state}"


def _scheduled(item: Scheduled) -> str:
    if item.every_min is None:
        return f" ({item.engine}) no periodic checkpoints"
    last = f", last {item.last_at} {item.last}" if item.last_at else ""
    return f" ({item.engine}) every {item.every_min:g} min{last}, next {item.next_at}"


def run(options: argparse.Namespace) -> int:
    if options.deadline is not None and options.deadline <= 0:
        raise UsageError(f"--deadline {options.deadline:g}: give a number of seconds above 0")
    socket = load_config().service.socket
    wanted = getattr(options, "containers", None)  # drain's alone
    only = chosen_ids(_status(socket), wanted) if wanted else []
    events = request(socket, Request(op=options.op, deadline_s=options.deadline, containers=only))
    if options.op == "reset":
        return _reset(events, options.json)
    return 0 if report(events, options.json) else 1


def _status(socket: str) -> Status:
    for event in request(socket, Request(op="status")):
        if isinstance(event, Status):
            return event
    raise ServiceRefusedError(f"gpuckptd on {socket} sent no status")


def chosen_ids(status: Status, words: Sequence[str]) -> list[str]:
    """The full IDs of the recorded containers `words` name (a name, an ID, or a unique ID prefix), each once, in
    the order given: one that names none is not found, before anything drains."""
    chosen: list[str] = []
    for word in words:
        found = [cid for cid in status.recorded if status.names.get(cid) == word or cid == word]
        found = found or [cid for cid in status.recorded if cid.startswith(word)]
        if not found:
            raise NotFoundError(f"{word}: no recorded container of that name or ID (gpuckpt service status lists "
                                "them; gpuckptd drains the containers gpuckpt-hook recorded)")
        if len(found) > 1:
            raise UsageError(f"{word}: the ID prefix of {len(found)} recorded containers: give more of it")
        chosen += [cid for cid in found if cid not in chosen]
    return chosen


def _reset(events: Iterable[Event], as_json: bool) -> int:
    """A refused reset is an error like any other (one line on stderr, led by the command; status 3), not a
    result on stdout with status 1."""
    for event in events:
        if isinstance(event, Result) and not event.ok:
            if as_json:
                print(event.model_dump_json())
            raise ServiceRefusedError(event.message)
        print(event.model_dump_json() if as_json else _line(event))
    return 0


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
