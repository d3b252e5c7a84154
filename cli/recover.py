"""`gpuckpt recover`: finish what killed gpuckpt-runtime processes left (their journals).

The next owned verb on a container does this by itself; this command (and gpuckptd at
start) does it for every container that has a journal, so CUDA processes a killed shim
locked are running again without waiting for someone to touch the container.
"""

from __future__ import annotations

import argparse

from ..shim.recover import recover_all


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("recover", help="finish the checkpoints and restores killed gpuckpt-runtime "
                                                 "processes left (every container's journal, or those named)")
    parser.add_argument("container", nargs="*", help="container IDs (default: every one with a journal)")
    parser.set_defaults(handler=run)


def run(options: argparse.Namespace) -> int:
    return 1 if recover_all(print, options.container) else 0
