"""The opt-in THP switch: set for the duration, shared by concurrent holders, always put back."""

import os
import subprocess
import sys

import pytest

from gpuckpt.cuda.hugepages import current_mode, hugepages_always


@pytest.fixture
def thp(tmp_path, node):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    return str(path)


def read(path: str) -> str:
    return open(path).read().strip()


def test_not_wanted_leaves_the_node_alone(thp) -> None:
    with hugepages_always(False, path=thp):
        assert current_mode(thp) == "madvise"


def test_set_for_the_duration_and_put_back_after_the_last_holder(thp) -> None:
    with hugepages_always(True, path=thp):
        assert read(thp) == "always"
        with hugepages_always(True, path=thp):
            assert read(thp) == "always"
        assert read(thp) == "always"  # the first holder still runs
    assert read(thp) == "madvise"


def test_put_back_when_the_block_fails(thp) -> None:
    with pytest.raises(RuntimeError):
        with hugepages_always(True, path=thp):
            raise RuntimeError("dump failed")
    assert read(thp) == "madvise"


HOLD = """
import sys, time
from gpuckpt.cuda.hugepages import hugepages_always
with hugepages_always(True, path=sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_killed_holder_does_not_keep_the_node_at_always(thp) -> None:
    """A shim killed (SIGKILL) while it held the setting: the next shim puts the node's mode back."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, thp], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert read(thp) == "always"
    finally:
        holder.kill()
        holder.wait()
    with hugepages_always(True, path=thp):
        assert read(thp) == "always"
    assert read(thp) == "madvise"


def test_a_shim_that_does_not_want_hugepages_puts_back_what_a_killed_holder_left(thp) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, thp], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.kill()
        holder.wait()
    with hugepages_always(False, path=thp):
        assert read(thp) == "madvise"
    assert read(thp) == "madvise"


def test_an_older_shims_counted_record_gives_back_its_saved_mode(thp, node) -> None:
    """Before holders were named, the record was 'COUNT SAVED': its holders cannot be checked, what the
    node had is kept and put back."""
    (node / "state").mkdir()
    (node / "state" / "thp.holders").write_text("1 madvise\n")
    with open(thp, "w") as setting:
        setting.write("always")  # as the older shim, killed, left it
    with hugepages_always(True, path=thp):
        assert read(thp) == "always"
    assert read(thp) == "madvise"
