"""`gpuckpt checkpoint --group LABEL` and `gpuckpt restore --group LABEL`: a job whose ranks live in separate
podman containers, labelled io.gpuckpt.group=LABEL, checkpointed and restored as one (service/group.py has the
phases). A label, not a list of names: the restore, and gpuckptd's drain and periodic checkpoints, find the
same members by it.
"""

from __future__ import annotations

import argparse

from ..cuda.node import NodeGpus
from ..errors import UsageError
from ..node.config import load_config
from ..service.group import GROUP_LABEL, GroupOptions, checkpoint_group, find_members, restore_group


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    checkpoint = commands.add_parser("checkpoint", help="checkpoint a job's podman containers as one: every "
                                                        "member's CUDA processes locked before any is dumped")
    checkpoint.add_argument("--group", metavar="LABEL", required=True,
                            help=f"the members: the podman containers labelled {GROUP_LABEL}=LABEL")
    checkpoint.add_argument("--leave-running", action="store_true",
                            help="every member keeps running after its dump")
    checkpoint.add_argument("--tcp-established", action="store_true",
                            help="dump the ranks' established TCP connections (podman's flag)")
    checkpoint.set_defaults(handler=run_checkpoint)


def _options(options: argparse.Namespace) -> GroupOptions:
    cuda = load_config().cuda
    return GroupOptions(leave_running=getattr(options, "leave_running", False),
                        tcp_established=options.tcp_established, lock_timeout_ms=cuda.lock_timeout_ms,
                        hugepages=cuda.wants_hugepages)


def run_checkpoint(options: argparse.Namespace) -> int:
    names = checkpoint_group(find_members(options.group), _options(options), NodeGpus())
    after = "left running" if options.leave_running else f"gpuckpt restore --group {options.group} brings them back"
    print(f"checkpointed group {options.group}, {len(names)} member(s) locked as one: {', '.join(names)}; {after}")
    return 0


# `gpuckpt restore` options that name one checkpoint's restore: a group restores its members in place
SINGLE_ONLY = ("name", "publish", "pod", "standby", "ignore_static_ip", "ignore_static_mac", "ignore_rootfs",
               "ignore_volumes", "trust_config", "signature", "json")


def run_restore_group(options: argparse.Namespace) -> int:
    """`gpuckpt restore --group LABEL`: every member restored, then every GPU state back together."""
    if options.checkpoint is not None:
        raise UsageError(f"--group restores the members where podman keeps their checkpoints: give it or "
                         f"CHECKPOINT ({options.checkpoint!r}), not both")
    if given := [f"--{name.replace('_', '-')}" for name in SINGLE_ONLY if getattr(options, name, None)]:
        raise UsageError(f"--group restores each member as it was checkpointed: {', '.join(given)} not allowed "
                         "with it (allowed: --tcp-established)")
    names = restore_group(find_members(options.group), _options(options), NodeGpus())
    print(f"restored group {options.group}, {len(names)} member(s), their GPU state brought back together: "
          f"{', '.join(names)}")
    return 0
