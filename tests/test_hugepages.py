"""The opt-in THP switch: set for the duration, shared by concurrent holders, always put back."""

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
