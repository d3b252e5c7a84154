"""gpuckpt-runtime's compiled launcher (shim/resident/launcher.c): the calls it passes through itself, from
the delegate cache the Python shim writes, and every other one handed to the Python shim unchanged."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support import build_launcher, write_config
from support import python_calls as count_python_calls

import gpuckpt
from gpuckpt.node.lock import StateKey
from gpuckpt.shim import resolve

REPO = Path(__file__).resolve().parent.parent
# gpuckpt as the test bed installed it from this tree (the launcher inserts its folder first on sys.path)
SITE = os.path.dirname(os.path.dirname(os.path.abspath(gpuckpt.__file__)))
# The test bed installs both (integration/testbed/install-system.sh), as the packages' build needs them.
pytestmark = pytest.mark.skipif(shutil.which("cc") is None or not Path("/usr/include/zlib.h").exists(),
                                reason="no cc or zlib.h: run integration/testbed/install-system.sh (gcc, zlib1g-dev)")


@pytest.fixture(scope="module")
def launcher_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_launcher(tmp_path_factory.mktemp("launcher"), SITE)


@pytest.fixture
def launcher(launcher_build, node, recording_runtime, monkeypatch) -> Path:
    """The launcher, a config naming the recording runtime, and no call noted yet."""
    built, calls = launcher_build
    calls.unlink(missing_ok=True)
    write_config(node, f'delegate = "{recording_runtime}"\n')
    monkeypatch.setenv("PYTHONPATH", "")  # the stand-in's -I ignores it anyway: the launcher names its site
    return built


def run(launcher: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(launcher), *argv], capture_output=True, text=True, timeout=30)


def python_calls(launcher_build) -> int:
    return count_python_calls(launcher_build[1])


def recorded(runtime: Path) -> list[str]:
    return (runtime.parent / "argv").read_text().splitlines()


def test_a_state_call_goes_to_the_delegate_without_python_once_the_shim_cached_it(launcher, launcher_build,
                                                                                  recording_runtime) -> None:
    first = run(launcher, "--root", "/run/r", "state", "c1")
    assert first.returncode == 0, first.stderr
    assert python_calls(launcher_build) == 1  # no cache yet: the shim resolved the delegate and wrote it
    assert recorded(recording_runtime) == ["--root", "/run/r", "state", "c1"]
    again = run(launcher, "--root=/run/r", "--debug", "state", "c2")
    assert again.returncode == 0, again.stderr
    assert python_calls(launcher_build) == 1
    assert recorded(recording_runtime) == ["--root=/run/r", "--debug", "state", "c2"]


@pytest.mark.parametrize("argv", [
    ["checkpoint", "--help"],
    ["restore", "-h"],
    ["checkpoint", "--image-path", "/x"],  # no container: the delegate's usage error
    ["create", "--bundle", "/b", "c1"],    # the config adds no hook
    ["kill", "c1", "KILL"],
])
def test_calls_the_shim_passes_through_skip_python(launcher, launcher_build, recording_runtime, argv) -> None:
    run(launcher, "state", "warm")  # writes the cache
    before = python_calls(launcher_build)
    result = run(launcher, *argv)
    assert result.returncode == 0, result.stderr
    assert python_calls(launcher_build) == before
    assert recorded(recording_runtime) == argv


@pytest.mark.parametrize("argv", [
    ["checkpoint", "--image-path", "/x", "c1"],
    ["restore", "--help=false", "c1"],
    ["delete"],  # no container: the shim's (the delegate's usage, through it)
    ["pause", "c1"],
    ["--version"],
    ["--help", "state", "c1"],
    ["--no-such-global", "state", "c1"],
    ["--", "state", "c1"],
])
def test_owned_verbs_and_anything_in_doubt_go_to_the_shim(launcher, launcher_build, argv) -> None:
    run(launcher, "state", "warm")
    before = python_calls(launcher_build)
    run(launcher, *argv)
    assert python_calls(launcher_build) == before + 1


def test_create_goes_to_the_shim_when_the_config_adds_the_hook(launcher, launcher_build, node,
                                                               recording_runtime) -> None:
    write_config(node, f'delegate = "{recording_runtime}"\n[hook]\nadd_to_spec = true\n')
    run(launcher, "state", "warm")
    before = python_calls(launcher_build)
    run(launcher, "create", "--bundle", "/nonexistent", "c1")
    assert python_calls(launcher_build) == before + 1


def test_a_changed_config_or_path_is_resolved_by_the_shim_again(launcher, launcher_build, node,
                                                                recording_runtime, tmp_path) -> None:
    run(launcher, "state", "warm")
    other = tmp_path / "other" / "runc"
    other.parent.mkdir()
    shutil.copy(recording_runtime, other)
    write_config(node, f'delegate = "{other}"\n')
    before = python_calls(launcher_build)
    assert run(launcher, "state", "c1").returncode == 0
    assert python_calls(launcher_build) == before + 1
    assert recorded(other) == ["state", "c1"]
    with_path = subprocess.run([str(launcher), "state", "c2"], capture_output=True, text=True, timeout=30,
                               env=dict(os.environ, PATH=f"/nonexistent:{os.environ['PATH']}"))
    assert with_path.returncode == 0
    assert python_calls(launcher_build) == before + 2


def test_a_cache_others_may_write_is_not_believed(launcher, launcher_build, node) -> None:
    run(launcher, "state", "warm")
    caches = list((node / "state").glob("delegate.cache.*"))
    assert len(caches) == 1
    caches[0].chmod(0o622)
    before = python_calls(launcher_build)
    run(launcher, "state", "c1")
    assert python_calls(launcher_build) == before + 1


def test_the_shim_sees_the_launchers_path_as_its_own(launcher, node) -> None:
    """The shim finds gpuckpt-hook beside its own path and keys the cache by it: the launcher's, not -c's."""
    result = run(launcher, "--version")
    assert result.returncode == 0 and "gpuckpt-runtime version" in result.stdout
    cached = (node / "state").glob("delegate.cache.*")
    assert [str(launcher) in path.read_text().split("\0") for path in cached] == [True]


def test_delete_passes_through_with_runc_and_no_lock_file(launcher, launcher_build, node, recording_runtime,
                                                          tmp_path) -> None:
    """shim/delete.py adds runc's words for a missing container (runc has them) and the removal of the container's
    lock file: with runc and no lock file the launcher runs runc's delete itself."""
    run(launcher, "state", "warm")
    before = python_calls(launcher_build)
    assert run(launcher, "delete", "--force", "c1").returncode == 0
    assert python_calls(launcher_build) == before
    assert recorded(recording_runtime) == ["delete", "--force", "c1"]
    locks = node / "state" / "locks"
    locks.mkdir(mode=0o700)
    (locks / "c2.lock").write_text("")
    run(launcher, "delete", "c2")
    assert python_calls(launcher_build) == before + 1
    assert not (locks / "c2.lock").exists()  # the shim's delete removed it
    this_root, other_root = (locks / f"{StateKey.of('c3', root).name}.lock" for root in ("/r3", "/other"))
    this_root.write_text("")  # c3's lock under --root /r3 (node/lock.py's names); c3 under another root has one too
    other_root.write_text("")
    run(launcher, "--root", "/r3/", "delete", "c3")
    assert python_calls(launcher_build) == before + 2  # a lock file of the ID: the shim's delete
    assert not this_root.exists() and other_root.exists()  # its root's went, the other container's stays
    crun = tmp_path / "crun-bin" / "crun"
    crun.parent.mkdir()
    shutil.copy(recording_runtime, crun)
    write_config(node, f'delegate = "{crun}"\n')
    run(launcher, "state", "warm")
    before = python_calls(launcher_build)
    run(launcher, "delete", "c3")
    assert python_calls(launcher_build) == before + 1


NAMES = ["crun", "runc", "crun.real", "CRUN", "kata", "gpuckpt-runtime"]


@pytest.fixture
def named_runtimes(launcher, node, tmp_path, recording_runtime) -> tuple[dict[str, Path], Path, dict[str, str]]:
    """The launcher linked under each of NAMES (as `gpuckpt install --engine podman --default` links it for podman's
    runtimes), a recording runc and crun first on PATH and a configured delegate of another name: the links, the
    configured delegate and the environment."""
    configured = tmp_path / "configured" / "delegate"
    configured.parent.mkdir()
    shutil.copy(recording_runtime, configured)
    write_config(node, f'delegate = "{configured}"\n')
    on_path = tmp_path / "on-path"
    for name in ("runc", "crun"):
        (on_path / name).mkdir(parents=True)
        shutil.copy(recording_runtime, on_path / name / name)
    (tmp_path / "as").mkdir()
    links = {name: tmp_path / "as" / name for name in NAMES}
    for link in links.values():
        link.symlink_to(launcher)
    path = f"{on_path / 'runc'}:{on_path / 'crun'}:{os.environ['PATH']}"
    return links, configured, dict(os.environ, PATH=path)


def test_a_call_under_a_delegates_name_runs_that_delegate_in_the_launcher_and_the_shim_alike(
        named_runtimes, launcher_build, tmp_path) -> None:
    """podman runs a runtime of its table with the table's path as argv[0]: called as runc or crun (shim/resolve.py
    DELEGATE_NAMES) the shim delegates to the program of that name, any other name to the configured delegate. The
    shim chooses and caches; the compiled launcher finds that entry by the same name (or falls back to the shim)."""
    links, configured, env = named_runtimes
    cached: set[str] = set()  # the names whose choice is cached (every other name shares one entry)
    for name, link in links.items():
        expected = (tmp_path / "on-path" / name / name) if name in resolve.DELEGATE_NAMES else configured
        for caller in ["shim", "launcher"]:
            for written in (tmp_path / "on-path" / "runc" / "argv", tmp_path / "on-path" / "crun" / "argv",
                            configured.parent / "argv"):
                written.unlink(missing_ok=True)
            before = python_calls(launcher_build)
            result = subprocess.run([str(link), "state", f"{caller}-{name}"], capture_output=True, text=True,
                                    timeout=30, env=env)
            assert result.returncode == 0, result.stderr
            started = python_calls(launcher_build) - before
            assert started == (0 if resolve.delegate_named(str(link)) in cached else 1), (name, caller)
            cached.add(resolve.delegate_named(str(link)))
            assert recorded(expected) == ["state", f"{caller}-{name}"], (name, caller)


@pytest.mark.parametrize(("called_as", "named"), [
    ("/etc/containers/gpuckpt-runtime.as/crun", "crun"), ("runc", "runc"), ("/x/runc/", ""), ("/usr/bin/crun.real", ""),
    ("/usr/bin/gpuckpt-runtime", ""), ("", ""), ("/x/RUNC", ""),
])
def test_the_name_a_call_was_made_under_chooses_only_a_known_delegate(called_as: str, named: str) -> None:
    assert resolve.delegate_named(called_as) == named
