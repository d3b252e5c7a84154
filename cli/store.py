"""`gpuckpt store`: podman containers' checkpoints kept in the node's deduplicating store (store/).

    gpuckpt store checkpoint CONTAINER [--name N] [--leave-running]   podman's checkpoint, chunked in
    gpuckpt store list | show [--json]                                 what it holds; show: new and shared bytes
    gpuckpt store restore NAME [--name N]                              every chunk verified, then podman restores
    gpuckpt store export NAME FILE|oci:DIR[:TAG]                       a signed archive or image, as export writes
    gpuckpt store verify [NAME...]                                     every chunk checked; bad ones named
    gpuckpt store remove NAME... | prune --keep N [--container C]      then the unreferenced chunks collected

`--store DIR` (default /var/lib/gpuckpt/store) picks another store.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict

from ..errors import ImageError, UsageError
from ..node.container_record import container_label, short_id
from ..store import podman
from ..store.catalog import usage, verify_store
from ..store.manifest import check_name
from ..store.repository import DEFAULT_STORE_DIR, Store
from ..store.retention import Collected, checkpoints, collect, to_prune
from .output import StoredRow, StoreList, counted, size_text
from .progress import byte_bar, moved_to
from .transfer import add_restore_options, restore_options


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", metavar="DIR", default=DEFAULT_STORE_DIR,
                        help=f"the store's directory (default {DEFAULT_STORE_DIR}; made root-only)")
    common.add_argument("--threads", type=int, default=0, help="threads for chunks (default: two per CPU)")
    store = commands.add_parser("store", help="checkpoints kept in the node's deduplicating store")
    verbs = store.add_subparsers(dest="store_command", required=True, metavar="VERB")
    checkpoint = verbs.add_parser("checkpoint", parents=[common], help="checkpoint a podman container into the store")
    checkpoint.add_argument("container", help="podman container name or ID")
    checkpoint.add_argument("--name", help="the checkpoint's name (default: CONTAINER-TIME)")
    checkpoint.add_argument("--leave-running", action="store_true", help="keep the container running")
    checkpoint.add_argument("--tcp-established", action="store_true", help="checkpoint established TCP connections")
    checkpoint.set_defaults(handler=run_checkpoint)
    for verb, text in (("list", "the stored checkpoints"),
                       ("show", "per checkpoint its logical size, the bytes it added and the bytes it shares")):
        shown = verbs.add_parser(verb, parents=[common], help=text)
        shown.add_argument("--json", action="store_true", help="as JSON")
        shown.set_defaults(handler=run_show, verb=verb)
    restore = verbs.add_parser("restore", parents=[common], help="restore a stored checkpoint through podman")
    restore.add_argument("checkpoint", help="the stored checkpoint's name")
    add_restore_options(restore, name_dest="container_name")
    restore.add_argument("--trust-config", action="store_true",
                         help="restore even if its container config asks for more than podman run gives (as import)")
    restore.set_defaults(handler=run_restore, standby=False)  # gpuckpt restore --standby sets it
    export = verbs.add_parser("export", parents=[common], help="a stored checkpoint as a signed podman archive")
    export.add_argument("checkpoint", help="the stored checkpoint's name")
    export.add_argument("output", help="archive to write (.tar.zst), or oci:DIR[:TAG] for a checkpoint image layout")
    export.set_defaults(handler=run_export)
    verify = verbs.add_parser("verify", parents=[common], help="read and check every chunk")
    verify.add_argument("checkpoints", nargs="*", metavar="NAME", help="only these checkpoints (default: all)")
    verify.set_defaults(handler=run_verify)
    remove = verbs.add_parser("remove", parents=[common], help="remove checkpoints and collect their chunks")
    remove.add_argument("checkpoints", nargs="+", metavar="NAME")
    remove.add_argument("--wait", type=float, default=None, metavar="S",
                        help="give up collecting after S seconds of a checkpoint being written (default: wait)")
    remove.set_defaults(handler=run_remove)
    prune = verbs.add_parser("prune", parents=[common], help="keep the newest N checkpoints of each container")
    prune.add_argument("--keep", type=int, required=True, metavar="N", help="checkpoints kept per container (0: none)")
    prune.add_argument("--container", help="only this container's (name or ID)")
    prune.add_argument("--wait", type=float, default=None, metavar="S",
                       help="give up collecting after S seconds of a checkpoint being written (default: wait)")
    prune.set_defaults(handler=run_prune)


def _open(options: argparse.Namespace) -> Store:
    if options.threads < 0:
        raise UsageError(f"--threads {options.threads}: give 0 (two per CPU) or more")
    return Store(options.store)


@contextmanager
def _bar(what: str, total: int | None) -> Iterator[Callable[[int], None]]:
    with byte_bar(what, total) as bar:
        yield lambda done: moved_to(bar, done)


def run_checkpoint(options: argparse.Namespace) -> int:
    flags = [flag for flag, wanted in (("--leave-running", options.leave_running),
                                       ("--tcp-established", options.tcp_established)) if wanted]
    started = time.monotonic()
    with _open(options) as store:
        stored = podman.checkpoint_into(store, options.container, options.name, flags, threads=options.threads,
                                        progress=_bar)  # a failed one removes the chunks it wrote (store/podman.py)
    print(f"stored {container_label(stored.container, stored.container_id)} as {stored.name} in "
          f"{time.monotonic() - started:.1f} s: {size_text(stored.logical_bytes)} of checkpoint, "
          f"{size_text(stored.new_bytes)} of it new ({size_text(stored.new_stored_bytes)} written)")
    return 0


def run_show(options: argparse.Namespace) -> int:
    with _open(options) as store:
        if options.verb == "list":
            listed = StoreList(store=store.root, checkpoints=[
                StoredRow(short_id=short_id(checkpoint.container_id),
                          **checkpoint.model_dump(include=set(StoredRow.model_fields) - {"short_id"}))
                for checkpoint in checkpoints(store)])
            if options.json:
                listed.print_json()
                return 0
            print(f"{'NAME':40} {'CONTAINER':24} {'ID':12} {'CREATED':20} {'SIZE':>10}")
            for row in listed.checkpoints:
                print(f"{row.name:40} {row.container:24} {row.short_id:12} {row.created:20} "
                      f"{size_text(row.logical_bytes):>10}")
            return 0
        shown = usage(store)
    if options.json:
        print(json.dumps(asdict(shown), indent=2))
        return 0
    print(f"{'NAME':40} {'CONTAINER':20} {'LOGICAL':>10} {'NEW':>10} {'SHARED':>10} {'ONLY ITS':>10}")
    for used in shown.checkpoints:
        sizes = (used.logical_bytes, used.new_bytes, used.shared_bytes, used.unique_bytes)
        print(f"{used.name:40} {used.container:20} " + " ".join(f"{size_text(size):>10}" for size in sizes))
    print(f"{counted(len(shown.checkpoints), 'checkpoint')}, {size_text(shown.logical_bytes)} in all, kept as "
          f"{counted(shown.chunks, 'chunk')}: {size_text(shown.chunk_bytes)}, {size_text(shown.stored_bytes)} on disk")
    return 0


def run_restore(options: argparse.Namespace) -> int:
    check_name(options.checkpoint)
    chosen = restore_options(podman.podman(), options, options.container_name)  # before a chunk is read
    started = time.monotonic()
    with _open(options) as store:
        restored = podman.restore_from(store, options.checkpoint, chosen, trust_config=options.trust_config,
                                       threads=options.threads, progress=_bar, standby=options.standby)
    state = " in standby (gpuckpt resume)" if options.standby else ""
    # --name's container, where given: the checkpoint's own name is the container it was made of
    print(f"restored {container_label(options.container_name or restored.container, restored.podman_line)}{state} "
          f"from checkpoint {options.checkpoint} in {time.monotonic() - started:.1f} s ({', '.join(restored.phases)})")
    return 0


def run_export(options: argparse.Namespace) -> int:
    check_name(options.checkpoint)
    started = time.monotonic()
    with _open(options) as store:
        where, signed, size = podman.export_from(store, options.checkpoint, options.output, options.threads, _bar)
    print(f"exported checkpoint {options.checkpoint} to {where}: {size_text(size)} of checkpoint, "
          f"{time.monotonic() - started:.1f} s, signed ({signed})")
    return 0


def run_verify(options: argparse.Namespace) -> int:
    for name in options.checkpoints:
        check_name(name)
    with _open(options) as store:
        verified = verify_store(store, options.checkpoints or None, options.threads)
    for digest, line in verified.bad.items():
        print(f"{line} (named by {', '.join(verified.referenced_by[digest][:5])})")
    if verified.bad:
        broken = sorted({name for names in verified.referenced_by.values() for name in names})
        raise ImageError(f"{len(verified.bad)} of {verified.chunks} chunks are missing or corrupt: "
                         f"{', '.join(broken[:5])}{' and others' if len(broken) > 5 else ''} cannot be restored")
    print(f"verified {counted(verified.checkpoints, 'checkpoint')}: {counted(verified.chunks, 'chunk')}, "
          f"{size_text(verified.chunk_bytes)}, all intact"
          + (f"; {counted(verified.unreferenced, 'chunk')} no checkpoint names (gpuckpt store prune collects them)"
             if verified.unreferenced else ""))
    return 0


def _collected(removed: list[str], collected: Collected) -> None:
    print(f"removed {', '.join(removed) if removed else 'no checkpoint'}; collected "
          f"{counted(collected.chunks, 'chunk')} ({size_text(collected.bytes)} on disk)"
          + (f", kept {collected.kept_recent} written since the collection began" if collected.kept_recent else ""))


def run_remove(options: argparse.Namespace) -> int:
    with _open(options) as store:
        for name in options.checkpoints:
            store.read_checkpoint(name)  # each exists and is readable before any goes
        for name in options.checkpoints:
            store.remove_checkpoint(name)
        _collected(options.checkpoints, collect(store, options.wait))
    return 0


def run_prune(options: argparse.Namespace) -> int:
    if options.keep < 0:
        raise UsageError(f"--keep {options.keep}: give 0 or more")
    with _open(options) as store:
        gone = to_prune(checkpoints(store), options.keep, options.container)
        for name in gone:
            store.remove_checkpoint(name)
        _collected(gone, collect(store, options.wait))
    return 0
