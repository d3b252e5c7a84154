"""A file held under a removed name while still linked (a POSIX named semaphore) through podman.

multiprocessing's locks with the "spawn" start method are glibc named semaphores: sem_open
maps /dev/shm/sem.<random>, links the semaphore's name to it and removes the random name.
CRIU then refuses the dump ("Can't create link remap ... Use link-remap option"). The test
image has no multiprocessing (python3-minimal), so the workload makes the same state by the
same three steps, then counts; the shim adds CRIU's link-remap and the restored workload
goes on, and with criu.link_remap = "never" CRIU refuses as before and the container keeps running.
A leave-running export carries CRIU's link_remap.N name in podman's copy of /dev/shm (CRIU removes
it as the dump ends, before podman copies the directory; the shim puts it back), so an import of
it restores too.
"""

from __future__ import annotations

import os
import re

import pytest
from bed import CONFIG, COUNTER_SOURCE, GPUCKPT, PODMAN_IMAGE, assert_continues, sh, wait_counter

SEMAPHORE_LIKE = (
    "import os\n"
    "fd = os.open('/dev/shm/sem.gpuckptTmp', os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)\n"
    "os.write(fd, bytes(32))\n"
    "os.link('/dev/shm/sem.gpuckptTmp', '/dev/shm/sem.gpuckpt-lock')\n"
    "os.unlink('/dev/shm/sem.gpuckptTmp')\n"
)


def _start_semaphore_container(name: str) -> None:
    sh("podman", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none", PODMAN_IMAGE,
       "python3", "-c", SEMAPHORE_LIKE + COUNTER_SOURCE)


@pytest.fixture
def semaphore_container(runc_delegate):
    name = f"gpuckpt-linkremap-{os.getpid()}"
    _start_semaphore_container(name)
    yield name
    sh("podman", "rm", "-f", "-t", "0", name, check=False)


@pytest.fixture
def own_config_semaphore_container(tmp_path, monkeypatch):
    """The same container with a config of the test's own (GPUCKPT_CONFIG, which podman hands the runtime):
    the node's file is shared with the tests beside."""
    config = tmp_path / "config.toml"
    config.write_text('delegate = "runc"\n')
    config.chmod(0o644)
    monkeypatch.setenv("GPUCKPT_CONFIG", str(config))
    name = f"gpuckpt-linkremap-export-{os.getpid()}"
    _start_semaphore_container(name)
    yield name
    sh("podman", "rm", "-f", "-t", "0", name, check=False)


def _shm_listing(name: str) -> list[str]:
    return sorted(sh("podman", "exec", name, "ls", "/dev/shm").stdout.split())


def _state(name: str):
    return lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout


def test_named_semaphore_is_dumped_with_link_remap_and_restored(semaphore_container):
    name = semaphore_container
    before = wait_counter(_state(name), 2)
    sh("podman", "container", "checkpoint", name)
    sh("podman", "container", "restore", name)
    assert_continues(before, _state(name))
    # the semaphore is still one file under its name, and the temporary link is gone again
    listing = sh("podman", "exec", name, "ls", "/dev/shm").stdout.split()
    assert listing == ["sem.gpuckpt-lock"], listing


def test_link_remap_never_leaves_it_to_criu_and_the_container_running(semaphore_container):
    name = semaphore_container
    before = wait_counter(_state(name), 2)
    with CONFIG.open("a") as config:
        config.write('[criu]\nlink_remap = "never"\n')
    refused = sh("podman", "container", "checkpoint", name, check=False)
    assert refused.returncode != 0
    assert "sem.gpuckptTmp is held under a removed name" in refused.stderr, refused.stderr
    # runc 1.1 names CRIU's log ("log file: PATH" at the end of a logfmt msg="..."); runc 1.3 quotes
    # it ("--- Quoting \"PATH\"")
    named = re.search(r'log file: ([^\s"\\]+)|Quoting \\"([^"\\]+)\\"', refused.stderr)
    assert named, refused.stderr
    dump_log = named.group(1) or named.group(2)
    assert "Use link-remap option" in open(dump_log).read()
    assert sh("podman", "inspect", "--format", "{{.State.Status}}", name).stdout.strip() == "running"
    assert_continues(before, _state(name))


def test_leave_running_export_of_a_named_semaphore_imports(own_config_semaphore_container, tmp_path):
    """CRIU removes its link_remap.N as a leave-running dump ends, and podman copies /dev/shm into the
    archive only after the runtime returned: without the shim putting the name back, CRIU's restore of
    the import fails ("Can't link dev/shm/link_remap.N -> dev/shm/sem.gpuckptTmp")."""
    name = own_config_semaphore_container
    before = wait_counter(_state(name), 2)
    sh(GPUCKPT, "export", name, "-o", str(tmp_path / "first.tar.zst"), "--leave-running")
    assert sh("podman", "inspect", "--format", "{{.State.Status}}", name).stdout.strip() == "running"
    assert_continues(before, _state(name))  # the original goes on
    left = _shm_listing(name)
    # a second leave-running export: CRIU picks the same link_remap name again, which the first left
    exported = sh(GPUCKPT, "export", name, "-o", str(tmp_path / "second.tar.zst"), "--leave-running", check=False)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert _shm_listing(name) == left
    sh("podman", "rm", "-f", "-t", "0", name)
    imported = sh(GPUCKPT, "import", str(tmp_path / "second.tar.zst"), check=False)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert_continues(before, _state(name))  # the checkpointed workload, going on
    # CRIU removed its remap name again as the restore ended; the original kept it (the cost)
    assert _shm_listing(name) == ["sem.gpuckpt-lock"]
    assert len(left) == 2 and left[1] == "sem.gpuckpt-lock" and re.fullmatch(r"link_remap\.[0-9]+", left[0]), left
