"""`gpuckpt pool take CHECKPOINT | status`: gpuckptd's warm pool (service/pool.py), asked through its socket.

`take` hands out the oldest standby of CHECKPOINT (as pool.standbys names it), resumed onto its GPUs, and
prints its container name; the service restores the next one in the background.
"""

from __future__ import annotations

import argparse

from ..node.config import load_config
from ..service.api import PoolState, Request, Result
from ..service.client import request


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pool = commands.add_parser("pool", help="gpuckptd's warm pool of standby restores")
    verbs = pool.add_subparsers(dest="pool_command", required=True, metavar="VERB")
    take = verbs.add_parser("take", help="hand out a standby of CHECKPOINT, resumed onto its GPUs")
    take.add_argument("checkpoint", metavar="CHECKPOINT", help="as pool.standbys names it (store name or archive path)")
    take.add_argument("--json", action="store_true", help="the service's answer as JSON")
    take.set_defaults(handler=run, op="pool-take")
    status = verbs.add_parser("status", help="the standbys held, per checkpoint, and the host memory they hold")
    status.add_argument("--json", action="store_true", help="the service's answer as JSON")
    status.set_defaults(handler=run, op="pool-status", checkpoint=None)


def run(options: argparse.Namespace) -> int:
    ok = True
    for event in request(load_config().service.socket, Request(op=options.op, checkpoint=options.checkpoint)):
        if options.json:
            print(event.model_dump_json())
        elif isinstance(event, PoolState):
            print(_state_lines(event))
        elif isinstance(event, Result):
            print(event.done[0] if event.ok and event.done else event.message)
        if isinstance(event, Result):
            ok = ok and event.ok
    return 0 if ok else 1


def _state_lines(state: PoolState) -> str:
    lines = [f"{state.held_bytes / 2**30:.2f} of {state.budget_bytes / 2**30:.2f} GiB of host memory held "
             "(pool.host_budget_bytes)"]
    for checkpoint, wanted in sorted(state.wanted.items()):
        mine = [entry for entry in state.standbys if entry.checkpoint == checkpoint]
        lines.append(f"{checkpoint}: {len(mine)} of {wanted} standby(s) ready")
        lines += [f"  {entry.container}  {entry.host_bytes / 2**30:.2f} GiB  since {entry.created}" for entry in mine]
    return "\n".join(lines)
