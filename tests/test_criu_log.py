"""CRIU's log read for the one line an operator sees when a dump fails, and for a dump that finished."""

from __future__ import annotations

import os
import time

from gpuckpt.shim.criu_log import dump_failure, dump_finished

FAILED = """(00.066301) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.202653) Error (criu/files-reg.c:1790): Can't lookup mount=27 for fd=3 path=/tmp/host-only\x1b[2J
(00.202671) Error (criu/cr-dump.c:1545): Dump files (pid: 9412) failed with -1
(00.273397) Error (criu/cr-dump.c:1975): Dumping FAILED.
"""


def test_the_cause_is_the_last_error_before_criu_sums_up(tmp_path) -> None:
    (tmp_path / "dump.log").write_text(FAILED)
    reason = dump_failure(str(tmp_path), time.time() - 60)
    assert reason == f"; CRIU: Can't lookup mount=27 for fd=3 path=/tmp/host-only?[2J ({tmp_path}/dump.log)"


def test_an_earlier_dumps_log_says_nothing_of_this_one(tmp_path) -> None:
    log = tmp_path / "dump.log"
    log.write_text(FAILED + "(00.3) Dumping finished successfully\n")
    os.utime(log, (time.time() - 600, time.time() - 600))
    assert dump_failure(str(tmp_path), time.time() - 60) == ""
    assert not dump_finished(str(tmp_path), time.time() - 60)
    assert dump_finished(str(tmp_path), time.time() - 6000)


def test_a_log_that_is_a_link_is_not_read(tmp_path) -> None:
    (tmp_path / "elsewhere").write_text(FAILED)
    (tmp_path / "dump.log").symlink_to(tmp_path / "elsewhere")
    assert dump_failure(str(tmp_path), 0) == ""
