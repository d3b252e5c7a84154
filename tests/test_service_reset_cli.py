"""`gpuckpt service reset` refused by gpuckptd (its preemption's notice still stands) is an error like any other:
one line on stderr led by "gpuckpt service", exit status 3 (refused), nothing on stdout; the reset that follows
the notice's end clears it (issue 33's operator trial: the refusal came on stdout, unled, with status 1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuckpt.cli.main import main


@pytest.mark.skipif(os.geteuid() != 0, reason="gpuckptd's socket answers only root (SO_PEERCRED): CI runs as root")
def test_a_refused_reset_is_one_line_on_stderr_with_status_3(node: Path, capsys, served_watch) -> None:
    served = served_watch()
    notice, watch = served.notice, served.watch
    notice.touch()  # the file's notice: an empty drain (nothing recorded), then drained until a reset
    served.drained()
    capsys.readouterr()
    assert main(["service", "reset"]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"gpuckpt service: not cleared: {notice} still exists (remove it), so the next tick would drain "
                   "again; clear the preemption once it does not\n")
    assert main(["service", "reset", "--json"]) == 3  # the service's answer on stdout, the line on stderr
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is False and err.startswith("gpuckpt service: not cleared: ")
    assert watch.view().state == "drained"

    notice.unlink()
    assert main(["service", "reset"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("preemption cleared (noticed ") and "gpuckpt service:" not in err
    assert watch.view().state == "watching"
