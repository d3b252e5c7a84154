"""Progress of gpuckpt's long operations (export, import, drain, restore) on a terminal: tqdm's
bars, with bytes (or containers), rate and time left.

Shown only where someone watches: stderr is a terminal and the process is not systemd's (a unit's
process, or a child of one, has INVOCATION_ID; one whose output is the journal, JOURNAL_STREAM):
there gpuckptd's STATUS= line carries the progress. A script, a pipe or an engine calling us gets
quiet stderr.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm

SYSTEMD_VARIABLES = ("INVOCATION_ID", "JOURNAL_STREAM")  # set by systemd for the processes of a unit
REDRAW_S = 0.5  # a bar is redrawn at most this often: updates come per chunk of data


def watched() -> bool:
    """Whether a person sees stderr: a terminal, outside systemd."""
    if any(os.environ.get(name) for name in SYSTEMD_VARIABLES):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # not a file, or closed
        return False


def byte_bar(what: str, total_bytes: int | None = None) -> tqdm:
    """Bytes moved of `total_bytes` (None: not known, then no time left), their rate and the time
    left, on stderr; writes nothing where no one watches. `moved_to` advances it."""
    # tqdm's own formats name the unit in the rate only ("3.01M/3.01M"): binary units throughout
    known = "{l_bar}{bar}| {n_fmt}iB/{total_fmt}iB [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
    unknown = "{desc}: {n_fmt}iB [{elapsed}, {rate_fmt}{postfix}]"
    return tqdm(desc=what, total=total_bytes, unit="iB", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                mininterval=REDRAW_S, disable=not watched(), bar_format=unknown if total_bytes is None else known)


def moved_to(bar: tqdm, done_bytes: int) -> None:
    """The bar at `done_bytes` (its callers know the count, not the step)."""
    bar.update(done_bytes - bar.n)


def container_bar(what: str, total: int | None = None) -> tqdm:
    """Containers done of `total`, their rate and the time left, on stderr (the bytes go in its
    postfix: `bytes_done`); quiet where no one watches. Lines above it go through tqdm.write."""
    unknown = "{desc}: {n_fmt} containers [{elapsed}, {rate_fmt}{postfix}]"  # tqdm's own reads "2container"
    return tqdm(desc=what, total=total, unit="container", file=sys.stderr, mininterval=0, disable=not watched(),
                bar_format=unknown if total is None else None)


def bytes_done(bar: tqdm, done_bytes: int, total_bytes: int | None = None) -> None:
    """The bytes the bar's containers have moved so far (of `total_bytes`, where known)."""
    done = _binary(done_bytes)
    bar.set_postfix_str(f"{done} of {_binary(total_bytes)}" if total_bytes else done)


def _binary(count: int) -> str:
    return f"{count} B" if count < 1024 else tqdm.format_sizeof(count, "iB", 1024)


def line_above(bar: tqdm | None, text: str) -> None:
    """`text` on stdout, above the bar where one is shown (tqdm clears and redraws it); a plain
    print otherwise, with none of tqdm's locks."""
    if bar is not None and not bar.disable:
        tqdm.write(text, file=sys.stdout)
    else:
        print(text)
    sys.stdout.flush()
