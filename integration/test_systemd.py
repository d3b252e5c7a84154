"""gpuckptd under real systemd: the .deb installed on a machine whose PID 1 is systemd (this one's is
not: a podman container booting Debian 12's systemd stands in for it), the service started by the
package and READY as systemd sees it, its journal fields for each container, a drain of a podman
container running inside, `systemctl stop` draining before it exits 0, and a shutdown of that machine
draining before systemd stops the containers' scopes, then the restore when it boots again.

Phases: the .deb comes from the session's build (conftest.py built_packages, shared with
test_packages); the machine's image
(testbed/systemd-image.sh: bookworm, systemd, podman, runc; cached in /var/cache/gpuckpt-testbed)
boots in a privileged container with a cgroup namespace of its own, without network, its container
storage and journal on directories of the test's (the journal outlives a shutdown), the test bed's
CRIU prefix bound read-only; the .deb is installed there by apt as the README tells operators, the
runtime registered with its podman and the test image imported. The tests then run in order on that
one machine (each goes on from the state the one before left); it is removed at the end with the
cgroups it left.

Checkpoints nest: the inner podman checkpoints through gpuckpt-runtime, runc and CRIU 4.2 inside the
container, its systemd in unified (cgroup v2) mode over the container's own subtree (the host's
controllers are all on v1 hierarchies, so that subtree has none: no pids limit there).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bed import COUNTER_SOURCE, ROOTFS_TAR, assert_continues, sh, wait_counter

import gpuckpt

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
HELPER_UNIT, HELPER_SOCKET = "gpuckpt-runtimed.service", "gpuckpt-runtimed.socket"  # the runtime's resident helper
IMAGE_SCRIPT = REPO / "integration" / "testbed" / "systemd-image.sh"
CRIU_PREFIX = "/opt/gpuckpt/criu"  # install-system.sh's; its wrapper is the image's /usr/local/sbin/criu
UNIT = "gpuckptd.service"
ARCHIVE_DIR = "/var/lib/gpuckpt/drain"  # service.archive_dir's default
INNER_IMAGE = "localhost/gpuckpt-test:latest"
# The counter as a workload that ends on SIGTERM (as one started under an init or with a handler
# does): stopped by systemd before the drain, it would be gone.
ENDS_ON_SIGTERM = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))\n"
_names = itertools.count()


class Machine:
    """The container whose PID 1 is systemd: commands run in it, its units, its journal."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, *argv: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
        return sh("podman", "exec", self.name, *argv, check=check, timeout=timeout)

    def wait_booted(self, timeout_s: float = 180) -> None:
        """Until systemd says the boot is over (the bus answers only once it is up)."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.run("systemctl", "is-system-running", "--wait", check=False, timeout=timeout_s)
            if state.stdout.strip() in ("running", "degraded") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        failed = self.run("systemctl", "--failed", "--no-legend", "--plain", check=False).stdout
        assert state.stdout.strip() == "running", f"boot ended {state.stdout.strip()!r}: {state.stderr}\n{failed}"

    def unit(self, unit: str, *names: str) -> dict[str, str]:
        shown = self.run("systemctl", "show", unit, f"--property={','.join(names)}").stdout
        return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)

    def cursor(self) -> str:
        """Where the journal ends now: entries after it are the step's."""
        shown = self.run("journalctl", "--lines=0", "--show-cursor", "--quiet").stdout
        return shown.strip().removeprefix("-- cursor: ")

    def journal(self, cursor: str) -> list[dict[str, str]]:
        """Every entry after `cursor`. Matches are applied here: journalctl 252 given both a cursor and a
        match leaves out the first entry that matches."""
        lines = self.run("journalctl", "--output=json", f"--after-cursor={cursor}", "--no-pager").stdout
        return [json.loads(line) for line in lines.splitlines() if line.strip()]

    def service_log(self, cursor: str) -> list[dict[str, str]]:
        """gpuckptd's own entries after `cursor`, printed with the fields it adds."""
        entries = [entry for entry in self.journal(cursor) if entry.get("SYSLOG_IDENTIFIER") == "gpuckptd"]
        for entry in entries:
            fields = " ".join(f"{key}={entry[key]}" for key in ("CONTAINER_ID", "ENGINE", "PHASE", "BYTES", "SECONDS")
                              if key in entry)
            print(f"journal: gpuckptd: {entry['MESSAGE']}" + (f" [{fields}]" if fields else ""))
        return entries

    def start_counter(self, label: str, source: str = COUNTER_SOURCE) -> str:
        """A podman container of the counter, recorded by the hook (io.gpuckpt.inventory); its ID."""
        name = f"systemd-{label}-{next(_names)}"
        return self.run("podman", "run", "-d", "--name", name, "--network", "none", "--annotation",
                        "io.gpuckpt.inventory=true", INNER_IMAGE, "python3", "-c", source).stdout.strip()

    def state_reader(self, container_id: str) -> Callable[[], str]:
        return lambda: self.run("podman", "exec", container_id, "cat", "/tmp/state").stdout

    def running(self, container_id: str) -> bool:
        return self.run("podman", "inspect", "--format", "{{.State.Running}}", container_id).stdout.strip() == "true"


def by_message(entries: list[dict[str, str]], message: str, container_id: str | None = None) -> list[dict[str, str]]:
    return [entry for entry in entries if entry.get("MESSAGE", "").startswith(message)
            and (container_id is None or entry.get("CONTAINER_ID") == container_id)]


@pytest.fixture(scope="module")
def packages(built_packages: tuple[Path, str]) -> Path:
    return built_packages[0]  # the session's build, shared with test_packages


def remove_cgroups(container_id: str) -> None:
    """The cgroups podman made for the machine and the ones its systemd made below them, deepest first
    (podman removes them itself; this is for a machine that was killed half-way)."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / "libpod_parent" / f"libpod-{container_id}"
        if top.is_dir():
            for directory in sorted((path for path in top.rglob("*") if path.is_dir()), key=lambda p: -len(p.parts)):
                directory.rmdir()
            top.rmdir()


@pytest.fixture(scope="module")
def machine(packages: Path, tmp_path_factory) -> Iterator[Machine]:
    for needed in (CRIU_PREFIX, ROOTFS_TAR):
        assert os.path.exists(needed), f"{needed} missing: run integration/testbed/setup.sh"
    image = sh("bash", str(IMAGE_SCRIPT), timeout=1200).stdout.strip().splitlines()[-1]
    base = tmp_path_factory.mktemp("systemd-machine")
    (base / "storage").mkdir()
    (base / "journal").mkdir()
    name = f"gpuckpt-systemd-{os.getpid()}"
    started = time.monotonic()
    # --privileged: podman, runc and CRIU inside (mounts, namespaces, ptrace); --cgroupns=private: the
    # machine's systemd sees its own subtree as the root (testbed/systemd-image.sh's init mounts it).
    container_id = sh("podman", "run", "-d", "--name", name, "--privileged", "--cgroupns=private",
                      "--systemd=always", "--network", "none",
                      "-v", f"{base / 'storage'}:/var/lib/containers", "-v", f"{base / 'journal'}:/var/log/journal",
                      "-v", f"{CRIU_PREFIX}:{CRIU_PREFIX}:ro", "-v", f"{ROOTFS_TAR}:/mnt/rootfs.tar:ro",
                      "-v", f"{packages}:/mnt/packages:ro", image).stdout.strip()
    node = Machine(name)
    try:
        node.wait_booted()
        deb = next(packages.glob(f"gpuckpt_{gpuckpt.__version__}_*.deb")).name
        # No network in there: apt finds every dependency installed (python3.11, libsystemd0, runc).
        node.run("apt-get", "install", "-y", "-q", f"/mnt/packages/{deb}", timeout=600)
        node.run("gpuckpt", "install", "--engine", "podman", "--default")
        node.run("podman", "import", "--quiet", "--change", 'CMD ["/bin/sh"]', "/mnt/rootfs.tar", INNER_IMAGE,
                 timeout=300)
        print(f"machine {name}: booted, .deb installed, image imported in {time.monotonic() - started:.1f} s")
        yield node
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False, timeout=120)
        remove_cgroups(container_id)
        shutil.rmtree(base, ignore_errors=True)


def test_the_package_starts_gpuckptd_and_systemd_sees_it_ready(machine: Machine) -> None:
    # The .deb's unit lands in /usr/lib/systemd/system (Debian 12's /lib is a link to usr/lib).
    assert machine.run("dpkg", "-S", f"/lib/systemd/system/{UNIT}").stdout.startswith("gpuckpt: ")
    machine.run("test", "-f", f"/usr/lib/systemd/system/{UNIT}")
    assert machine.run("systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"  # by the package
    unit = machine.unit(UNIT, "Type", "ActiveState", "SubState", "StatusText", "WatchdogUSec", "KillMode",
                        "NRestarts", "TimeoutStartUSec", "TimeoutStopUSec", "After")
    print(f"systemctl show {UNIT}: {unit}")
    # Type=notify is active only after READY=1.
    assert (unit["Type"], unit["ActiveState"], unit["SubState"]) == ("notify", "active", "running")
    assert unit["StatusText"] == "serving /run/gpuckpt/gpuckptd.sock"
    assert (unit["WatchdogUSec"], unit["KillMode"], unit["NRestarts"]) == ("1min", "process", "0")
    assert (unit["TimeoutStartUSec"], unit["TimeoutStopUSec"]) == ("30min", "20min")
    assert {"podman.service", "docker.service", "containerd.service"} <= set(unit["After"].split())
    verify = machine.run("systemd-analyze", "verify", UNIT, check=False)
    assert verify.returncode == 0 and UNIT not in verify.stderr, verify.stderr
    doctor = machine.run("gpuckpt", "doctor", check=False).stdout
    print(doctor)
    assert f"ok     {UNIT} enabled, active: serving /run/gpuckpt/gpuckptd.sock; drains at stop;" in doctor


def test_a_drain_puts_each_containers_fields_in_the_journal(machine: Machine) -> None:
    container = machine.start_counter("drain")
    before = wait_counter(machine.state_reader(container), minimum=3)
    cursor = machine.cursor()
    drained = [json.loads(line) for line in machine.run("gpuckpt", "drain", "--json").stdout.splitlines()]
    assert drained[-1]["event"] == "result" and drained[-1]["ok"], drained[-1]
    assert container in drained[-1]["done"]
    assert not machine.running(container)
    entries = machine.service_log(cursor)
    [started] = by_message(entries, "checkpoint of podman container ", container)
    assert started["MESSAGE"].endswith(f" ({container[:12]}) started"), started  # its name and short ID, as podman ps
    [done] = by_message(entries, "checkpointed", container)
    assert (done["ENGINE"], done["PHASE"], done["_SYSTEMD_UNIT"]) == ("podman", "checkpoint", UNIT)
    assert int(done["BYTES"]) > 16 << 20 and float(done["SECONDS"]) > 0  # the counter's 16 MiB buffer, at least
    assert re.fullmatch(r"drain: 1 of 1 checkpointed, [0-9.]+( of [0-9.]+)? GiB",
                        machine.unit(UNIT, "StatusText")["StatusText"])
    # The runtime's checkpoint was worked by gpuckpt-runtimed, which the package's socket started
    helper = [entry for entry in machine.journal(cursor) if entry.get("_SYSTEMD_UNIT") == HELPER_UNIT]
    assert [entry for entry in helper if re.match(rf"gpuckpt-runtimed: checkpoint {container} for pid \d+: exit 0",
                                                  entry.get("MESSAGE", ""))], helper
    assert machine.unit(HELPER_SOCKET, "ActiveState", "UnitFileState") == {"ActiveState": "active",
                                                                           "UnitFileState": "enabled"}

    # The next start restores it, before READY.
    cursor = machine.cursor()
    machine.run("systemctl", "restart", UNIT, timeout=600)
    entries = machine.service_log(cursor)
    [restored] = by_message(entries, "restored", container)
    assert (restored["PHASE"], int(restored["BYTES"])) == ("restore", int(done["BYTES"]))
    assert by_message(entries, "restore: 1 done, 0 failed")
    assert_continues(before, machine.state_reader(container))


def test_systemctl_stop_drains_then_exits_0(machine: Machine) -> None:
    container = machine.start_counter("stop")
    before = wait_counter(machine.state_reader(container), minimum=3)
    cursor = machine.cursor()
    began = time.monotonic()
    machine.run("systemctl", "stop", UNIT, timeout=600)
    print(f"systemctl stop {UNIT}: {time.monotonic() - began:.1f} s")
    unit = machine.unit(UNIT, "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    assert unit == {"ActiveState": "inactive", "Result": "success", "ExecMainCode": "1", "ExecMainStatus": "0"}, unit
    entries = machine.service_log(cursor)
    assert by_message(entries, "checkpointed", container)
    [drain] = by_message(entries, "drain: ")
    assert ", 0 failed" in drain["MESSAGE"]
    assert entries[-1]["MESSAGE"] == "stopped"
    assert not machine.running(container)
    machine.run("test", "-f", f"{ARCHIVE_DIR}/{container}.json")

    machine.run("systemctl", "start", UNIT, timeout=600)
    assert_continues(before, machine.state_reader(container))
    machine.run("test", "!", "-e", f"{ARCHIVE_DIR}/{container}.json")


def test_a_killed_gpuckptd_restarts_and_the_containers_it_restored_run_on(machine: Machine) -> None:
    """Restart=on-failure, and KillMode=process: the conmon of each container gpuckptd restored (those
    the tests before left) lives in gpuckptd's cgroup and must outlive it."""
    containers = machine.run("podman", "ps", "-q", "--no-trunc").stdout.split()
    assert containers
    conmons = [machine.run("podman", "inspect", "--format", "{{.State.ConmonPid}}", container).stdout.strip()
               for container in containers]
    for conmon in conmons:
        assert f"/system.slice/{UNIT}" in machine.run("cat", f"/proc/{conmon}/cgroup").stdout
    before = {container: wait_counter(machine.state_reader(container)) for container in containers}
    machine.run("kill", "-KILL", machine.unit(UNIT, "MainPID")["MainPID"])
    deadline = time.monotonic() + 60
    while machine.unit(UNIT, "NRestarts", "ActiveState") != {"NRestarts": "1", "ActiveState": "active"}:
        assert time.monotonic() < deadline, machine.unit(UNIT, "NRestarts", "ActiveState", "SubState")
        time.sleep(0.5)
    for container in containers:
        assert_continues(before[container], machine.state_reader(container))
    machine.run("kill", "-0", *conmons)


def test_shutdown_drains_before_the_scopes_stop_and_boot_restores(machine: Machine) -> None:
    container = machine.start_counter("shutdown", ENDS_ON_SIGTERM + COUNTER_SOURCE)
    before = wait_counter(machine.state_reader(container), minimum=3)
    scope = machine.unit(f"libpod-{container}.scope", "Before", "DropInPaths")
    assert UNIT in scope["Before"].split(), scope  # the package's drop-in, on podman's transient scope
    assert any(path.endswith("/libpod-.scope.d/50-gpuckptd.conf") for path in scope["DropInPaths"].split())
    cursor = machine.cursor()
    began = time.monotonic()
    sh("podman", "stop", "-t", "600", machine.name, timeout=660)  # SIGRTMIN+3: systemd shuts the machine down
    stopped = time.monotonic()
    sh("podman", "start", machine.name)
    machine.wait_booted()
    print(f"shutdown {stopped - began:.1f} s, boot to the end of the restore {time.monotonic() - stopped:.1f} s")
    entries = machine.service_log(cursor)
    # It ends on SIGTERM: checkpointed means systemd had not stopped its scope yet.
    assert by_message(entries, "checkpointed", container)
    assert ", 0 failed" in by_message(entries, "drain: ")[0]["MESSAGE"]
    assert by_message(entries, "restored", container)
    assert_continues(before, machine.state_reader(container))
    scope_unit = f"libpod-{container}.scope"
    ordered = [entry["MESSAGE"] for entry in machine.journal(cursor)
               if entry.get("UNIT") in (UNIT, scope_unit) and entry.get("MESSAGE", "").startswith("Stop")]
    print(f"systemd: {ordered}")
    assert not any(message.startswith(f"Stopping {scope_unit}") for message in ordered)
