"""Integration fixtures: real engines, real runc/crun/CRIU, root only.

The test bed comes from integration/testbed/setup.sh; a missing part is an error
here, not a skip, so a broken install cannot pass unnoticed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from bed import (
    ROOTFS_TAR,
    configured_delegate,
    docker_registry,
    remove_left_trust_exceptions,
    remove_stale_hierarchies,
    sh,
)

FILES_SHOWN = 25
BUILD_SH = Path(__file__).resolve().parent.parent / "packaging" / "build.sh"


def pytest_terminal_summary(terminalreporter) -> None:
    """Seconds per test file, setup and teardown included, the dearest first: where a run's time goes (CI's
    budget is 45 minutes on 2 cores) without --durations=0's thousand lines."""
    per_file: Counter[str] = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                per_file[report.nodeid.split("::", 1)[0]] += report.duration
    if per_file:
        terminalreporter.write_sep("=", f"seconds per test file ({sum(per_file.values()):.0f} s in all, "
                                   f"the {min(FILES_SHOWN, len(per_file))} dearest)")
        for path, seconds in per_file.most_common(FILES_SHOWN):
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")


class PackageBuild:
    """packaging/build.sh all (lintian included) into a directory of its own, in the background: started as soon
    as collection shows a test needs the packages, it runs (minutes, mostly one core of CI's two) while the
    tests before that one do."""

    def __init__(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="gpuckpt-packages-"))
        with open(self.work / "stdout", "wb") as stdout, open(self.work / "stderr", "wb") as stderr:
            self.process = subprocess.Popen(["bash", str(BUILD_SH), "all", str(self.work / "packages")],
                                            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                            start_new_session=True)  # its group: stop() ends dpkg and rpm too

    def wait(self, timeout_s: float = 900) -> tuple[Path, str]:
        """The directory of the packages alone and build.sh's output, once it is done."""
        try:
            status = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"packaging/build.sh all: not done within {timeout_s} s") from None
        stdout = (self.work / "stdout").read_text()
        assert status == 0, f"packaging/build.sh all exited {status}:\n{stdout}\n{(self.work / 'stderr').read_text()}"
        return self.work / "packages", stdout

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=60)


PACKAGE_BUILD = pytest.StashKey[PackageBuild]()


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly and any(
            "built_packages" in getattr(item, "fixturenames", ()) for item in session.items):
        session.config.stash[PACKAGE_BUILD] = PackageBuild()


@pytest.hookimpl(trylast=True)  # after the fixtures' teardown: test_systemd's machine mounts the packages
def pytest_sessionfinish(session: pytest.Session) -> None:
    if (build := session.config.stash.get(PACKAGE_BUILD, None)) is not None:
        build.stop()
        shutil.rmtree(build.work, ignore_errors=True)


@pytest.fixture(scope="session")
def built_packages(request: pytest.FixtureRequest) -> tuple[Path, str]:
    """The .deb and .rpm of this tree, built once for every test that installs or inspects them (test_packages,
    test_systemd), started in the background at collection's end (PackageBuild). Returns the directory and
    build.sh's output."""
    if PACKAGE_BUILD not in request.config.stash:
        request.config.stash[PACKAGE_BUILD] = PackageBuild()
    return request.config.stash[PACKAGE_BUILD].wait()


@pytest.fixture(scope="session", autouse=True)
def no_stale_cgroup_hierarchy() -> Iterator[None]:
    """gpuckpt-runtime refuses crun restores while a cgroup v1 hierarchy is not mounted where crun enters it
    (host/cgroup_v1.py): one an earlier run or experiment on this machine left is removed first; one this run
    leaves is an error."""
    if removed := remove_stale_hierarchies():
        print(f"\nintegration: removed cgroup v1 hierarchies mounted nowhere, left from before: {', '.join(removed)}")
    yield
    left = remove_stale_hierarchies()
    assert not left, f"this run left cgroup v1 hierarchies mounted nowhere (removed now): {', '.join(left)}"


@pytest.fixture(scope="session", autouse=True)
def no_trust_exception_left() -> Iterator[None]:
    """A test that needs unsigned input allowed adds an exception to the node's trust policy for its own time
    (bed.unsigned_allowed_on_node); one a run killed mid-test left would make later runs fail (an exception
    that exists cannot be added again; one for restore:any lets through what tests expect refused), so it is
    removed first. SIGTERM (CI's time limit, `kill`) ends the run as Ctrl-C does: the finalizers that take
    the exceptions out run."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    if removed := remove_left_trust_exceptions():
        print(f"\nintegration: removed trust exceptions a killed test run left: {', '.join(removed)}")
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture(params=["runc", "crun"])
def delegate(request) -> Iterator[str]:
    with configured_delegate(request.param) as name:
        yield name


# docker (containerd 1.6) with plain crun 1.21 cannot checkpoint/restore; through the shim it
# can: the shim creates containerd's missing --work-path, says "does not exist" for a container
# the dump removed, and drops runc's -no-subreaper (see shim/argv.py, shim/delete.py).
@pytest.fixture(params=["runc", "crun"])
def docker_delegate(request) -> Iterator[str]:
    with configured_delegate(request.param) as name:
        yield name


@pytest.fixture
def runc_delegate() -> Iterator[str]:
    """For tests of what surrounds the runtime (archives, images): one delegate is enough."""
    with configured_delegate("runc") as name:
        yield name


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rootfs") / "rootfs"
    root.mkdir()
    sh("tar", "-C", str(root), "-xf", ROOTFS_TAR)
    return root


@pytest.fixture
def registry(tmp_path):
    with docker_registry(tmp_path) as port:
        yield f"127.0.0.1:{port}"
