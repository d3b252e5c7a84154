"""`gpuckpt-runtime delete`: the delegate's delete, with runc's words for a container that is gone.

After a checkpoint the delegate has already removed the container; containerd then deletes
its task and ignores the failure only when the runtime says "does not exist", as runc does.
crun says "No such file or directory" instead, and docker's restore then fails with "id
already in use". Everything else passes through unchanged. A deleted container's lock file
(node/journal.py) goes with it.
"""

from __future__ import annotations

import sys

from ..errors import GpuckptError
from ..node.lock import ContainerLock, StateKey, has_lock_file, id_has_lock_files
from .argv import RuntimeArgs, parse_verb_args
from .delegate import container_exists, run_delegate
from .log import log


def run(args: RuntimeArgs, delegate: str) -> int:
    status = run_delegate(delegate, args.argv)
    container_id = parse_verb_args(args.command_args, frozenset()).container_id
    if status == 0 and container_id and id_has_lock_files(container_id):
        try:
            key = StateKey.of(container_id, args.runtime_root(delegate))
            for lock_key in (key, StateKey.legacy(container_id)):  # the layout before roots': the ID's alone
                if has_lock_file(lock_key):
                    with ContainerLock(lock_key, "delete") as lock:
                        lock.remove_file()
        except (GpuckptError, OSError):
            pass  # held by a gpuckpt at work (it stays theirs), or an ID no lock file could have
    if status == 0 or container_id is None:
        return status
    if not container_exists(delegate, args.global_argv, container_id):
        message = f"container {container_id} does not exist"
        log(args, "error", message)
        sys.stderr.write(f"{message}\n")
    return status
