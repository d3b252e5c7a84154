"""runc's own checkpoint tests (tests/integration/checkpoint.bats of Debian's runc source) through the shim.

integration/runc-bats/run.sh runs the .bats file once with plain runc as $RUNC and once with the
installed gpuckpt-runtime (org.criu.config allowed by the operator's config it writes); this test
compares the two runs test by test: every test runc passes passes through the shim too, and a test
runc fails here fails through the shim for the delegate's or CRIU's reason, never a refusal of ours.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from bed import RUNTIME

RUN_SH = Path(__file__).parent / "runc-bats" / "run.sh"
TAP_RESULT = re.compile(r"^(ok|not ok) (\d+) (.*?)(?: # (skip|timeout).*)?$")
# What only the shim says when it refuses or fails a verb itself (errors.py's lines, the lock's words)
SHIM_WORDS = ("never completed", "refused", "gpuckpt process", "is lazy, completing", "gpuckpt-manifest.json")

# Skipped in both runs: the scenario another test proves (name -> that test). runc's lazy-pages test ends at bats'
# time limit here for runc and the shim alike (results/runc-bats/README.md), half a minute of each run;
# test_lazy_migration.py runs the same migration side by side, without the limit, and asserts more of it.
SKIPPED = {"checkpoint --lazy-pages and restore": "integration/test_lazy_migration.py runs it, runc and the shim "
                                                 "side by side"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runc's checkpoint tests need root")


def tap_results(path: Path) -> dict[int, tuple[str, str, str]]:
    """Test number -> (name, pass/fail/skip, the lines bats printed under it)."""
    results: dict[int, tuple[str, str, str]] = {}
    current = 0
    for line in path.read_text(errors="replace").splitlines():
        if match := TAP_RESULT.match(line):
            verdict = "skip" if match[4] == "skip" else ("pass" if match[1] == "ok" else "fail")
            current = int(match[2])
            results[current] = (match[3], verdict, "")
        elif current and line.startswith("#"):
            name, verdict, text = results[current]
            results[current] = (name, verdict, text + line + "\n")
    return results


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory) -> tuple[dict, dict, str]:
    if shutil.which("criu") is None:
        pytest.fail("criu is not installed: the test bed (integration/testbed/setup.sh) installs it")
    out = tmp_path_factory.mktemp("runc-bats")
    env = {**os.environ, "RUNC_SHIM": RUNTIME, "GPUCKPT_MACHINE": "test",
           "RUNC_BATS_SKIP": "".join(f"{name}\t{why}\n" for name, why in SKIPPED.items())}
    done = subprocess.run(["bash", str(RUN_SH), str(out)], env=env, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, f"run.sh failed ({done.returncode}): {done.stderr[-3000:]}"
    return tap_results(out / "test-runc.tap"), tap_results(out / "test-shim.tap"), done.stdout


def test_the_bed_runs_runcs_tests(side_by_side) -> None:
    """The comparison means something: runc itself passes its basic checkpoint test here."""
    runc, shim, _ = side_by_side
    assert len(runc) >= 5 and set(runc) == set(shim)
    assert runc[1] == ("checkpoint and restore", "pass", runc[1][2])
    for results in (runc, shim):
        skipped = {name for name, verdict, _ in results.values() if verdict == "skip"}
        assert set(SKIPPED) <= skipped, f"not skipped in both runs: {sorted(set(SKIPPED) - skipped)}"


def test_every_test_runc_passes_passes_through_the_shim(side_by_side) -> None:
    runc, shim, table = side_by_side
    worse = [f"{number} {runc[number][0]}: {shim[number][2][-1500:]}" for number in runc
             if runc[number][1] == "pass" and shim[number][1] != "pass"]
    assert not worse, f"pass with runc, not through the shim:\n{table}\n" + "\n".join(worse)


def test_what_fails_with_runc_fails_through_the_shim_for_the_same_reason(side_by_side) -> None:
    """A test runc fails too (CRIU's limits on this kernel): the shim passes it on, it adds no refusal."""
    runc, shim, _ = side_by_side
    ours = [f"{number} {runc[number][0]}: {word!r}" for number in runc
            if runc[number][1] == "fail" and shim[number][1] == "fail"
            for word in SHIM_WORDS if word in shim[number][2] and word not in runc[number][2]]
    assert not ours, "failed through the shim with words of its own: " + "; ".join(ours)
