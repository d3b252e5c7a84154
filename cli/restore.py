"""`gpuckpt restore [--standby] CHECKPOINT`: a stored checkpoint (by name) or an archive (a file or
oci:DIR[:TAG]) restored through podman, by `gpuckpt store restore` or `gpuckpt import` respectively;
`gpuckpt restore --group LABEL`: a group checkpointed together, restored together (cli/group.py).

--standby: the shim restores the processes and leaves their GPU state in host memory (docs/standby.md);
`gpuckpt resume` brings them onto the GPUs the restore's node check chose.
"""

from __future__ import annotations

import argparse
import os

from ..errors import UsageError
from ..store.repository import DEFAULT_STORE_DIR
from . import group, store, transfer


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    restore = commands.add_parser("restore", help="restore a stored checkpoint or an archive through podman, "
                                                  "optionally into standby")
    restore.add_argument("checkpoint", metavar="CHECKPOINT", nargs="?",
                         help="a stored checkpoint's name, or an archive (a path with a /, or oci:DIR[:TAG])")
    restore.add_argument("--group", metavar="LABEL", help="restore the checkpointed podman containers labelled "
                         "io.gpuckpt.group=LABEL together (gpuckpt checkpoint --group)")
    restore.add_argument("--standby", action="store_true",
                         help="leave the CUDA processes' GPU state in host memory until `gpuckpt resume`")
    transfer.add_restore_options(restore)
    restore.add_argument("--trust-config", action="store_true",
                         help="restore even if its container config asks for more than podman run gives")
    restore.add_argument("--signature", metavar="FILE", help="an archive's signature (default: ARCHIVE.sig)")
    restore.add_argument("--store", metavar="DIR", default=DEFAULT_STORE_DIR,
                         help=f"the store holding a named checkpoint (default {DEFAULT_STORE_DIR})")
    restore.add_argument("--threads", type=int, default=0, help="threads for a stored checkpoint's chunks")
    restore.add_argument("--json", action="store_true", help="the result as JSON (docs/cli-output.md)")
    restore.set_defaults(handler=run_restore)


def is_archive(checkpoint: str) -> bool:
    """A store name has no '/' (store.manifest.check_name): a path or an image layout is an archive."""
    return checkpoint.startswith("oci:") or os.sep in checkpoint


def run_restore(options: argparse.Namespace) -> int:
    if options.group is not None:
        return group.run_restore_group(options)
    if options.checkpoint is None:
        raise UsageError("give CHECKPOINT (a stored checkpoint's name or an archive) or --group LABEL")
    if is_archive(options.checkpoint):
        options.archive = options.checkpoint
        return transfer.run_import(options)
    options.container_name = options.name
    return store.run_restore(options)
