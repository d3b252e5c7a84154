"""The integration tests' helpers: constants of the test bed, running commands, the counter workload's state."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zstandard

from gpuckpt.host.cgroup_v1 import stale_hierarchies

HERE = Path(__file__).parent
COUNTER_SOURCE = (HERE / "workloads" / "counter.py").read_text()
# Prepended to the counter: an established TCP connection on the container's own
# loopback, which CRIU refuses to dump without --tcp-established.
TCP_HOLDER_SOURCE = (
    "import socket\n"
    "server = socket.socket(); server.bind(('127.0.0.1', 0)); server.listen()\n"
    "client = socket.create_connection(server.getsockname()); peer, _ = server.accept()\n"
)
PODMAN_IMAGE = "localhost/gpuckpt-test:latest"
DOCKER_IMAGE = "gpuckpt-test:latest"
DOCKER = "/usr/bin/docker"  # Debian's client; /usr/local/bin may hold an unrelated one
ROOTFS_TAR = "/var/cache/gpuckpt-testbed/rootfs-python.tar"
CONFIG = Path("/etc/gpuckpt/config.toml")
RUNTIME = shutil.which("gpuckpt-runtime") or "/usr/local/bin/gpuckpt-runtime"
GPUCKPT = shutil.which("gpuckpt") or "/usr/local/bin/gpuckpt"
RUNTIME_ROOT = "/run/gpuckpt-it"  # runc-level tests' --root


# the counter with a 256 MiB buffer: a checkpoint's phases (CRIU's dump, the stream) last long enough to interrupt
BIG_COUNTER = COUNTER_SOURCE.replace("16 << 20", "256 << 20")
assert BIG_COUNTER != COUNTER_SOURCE, "the counter's buffer size moved: 256 MiB is what makes the phases long"
# the counter for a --leave-running export: podman copies the root file system after the runtime's dump returned,
# with the processes running on (docs/archives.md), so a copy caught between writing state.new and renaming it
# finds state.new gone; it writes it again on its next tick, its memory (token, count, digest) as checkpointed
_RENAME = '    os.replace("/tmp/state.new", "/tmp/state")\n'
LATE_FILES_COUNTER = COUNTER_SOURCE.replace(_RENAME, "    try:\n    " + _RENAME + "    except FileNotFoundError:\n"
                                            "        continue\n")
assert LATE_FILES_COUNTER != COUNTER_SOURCE, "the counter's rename moved"


def podman_counter(prefix: str, test_name: str) -> str:
    """A podman container running BIG_COUNTER, named after the test; its name."""
    name = f"{prefix}-{os.getpid()}-{test_name.translate(str.maketrans('[]-', '___'))}"
    sh("podman", "run", "-d", "--name", name, "--network", "none", PODMAN_IMAGE, "python3", "-c", BIG_COUNTER)
    return name


@contextlib.contextmanager
def small_filesystem(directory: Path, size: str, label: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's size=, e.g. "4m") mounted at `directory`, root's only, unmounted after: a disk that
    fills up."""
    directory.mkdir()
    sh("mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", label, str(directory))
    try:
        yield directory
    finally:
        sh("umount", str(directory), check=False)


def read_state(name: str) -> Callable[[], str]:
    return lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout


def running(name: str) -> bool:
    return sh("podman", "inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def sh(*argv: str, check: bool = True, timeout: float = 180, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def start_from_checkpoint(name: str, checkpoint: str, *more: str, attempts: int = 5) -> subprocess.CompletedProcess:
    """`docker start --checkpoint`, tried again while dockerd's upload of the checkpoint into containerd's content
    store finds the blob there already (moby#42900, a race CRIU's own docker tests retry the same way); the last
    try's result (check its returncode)."""
    for _ in range(attempts):
        started = sh(DOCKER, "start", "--checkpoint", checkpoint, *more, name, check=False)
        if not ("failed to upload checkpoint to containerd" in started.stderr and "already exists" in started.stderr):
            return started
        time.sleep(1)
    return started


class Counter:
    """The counter workload's state as read from a container: token, count, checksum."""

    def __init__(self, line: str) -> None:
        self.token, count, self.digest = line.split()
        self.count = int(count)

    def __repr__(self) -> str:
        return f"Counter({self.token}, {self.count}, {self.digest[:8]})"


def wait_counter(read_state, minimum: int = 1, timeout_s: float = 30) -> Counter:
    """Poll the workload's state until its counter reaches `minimum`."""
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while time.monotonic() < deadline:
        try:
            line = read_state()
            if line.strip():
                state = Counter(line)
                assert state.digest != "CORRUPT", "workload found its buffer corrupted"
                if state.count >= minimum:
                    return state
        except (AssertionError, ValueError, OSError) as error:
            if "CORRUPT" in str(error):
                raise
            last_error = str(error)
        time.sleep(0.2)
    raise AssertionError(f"counter did not reach {minimum} within {timeout_s} s: {last_error}")


def assert_continues(before: Counter, read_state) -> Counter:
    """The restored workload is the checkpointed one, going on: same token, same buffer, counter advancing."""
    after = wait_counter(read_state, minimum=before.count + 3)
    assert after.token == before.token, f"workload restarted instead of restored: {before} -> {after}"
    assert after.digest == before.digest
    return after


def make_bundle(rootfs: Path, tmp_path: Path, **spec_changes) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    sh(RUNTIME, "spec", cwd=bundle)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["python3", "-c", COUNTER_SOURCE]
    spec["root"] = {"path": str(rootfs), "readonly": False}
    spec.update(spec_changes)
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def runtime(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return sh(RUNTIME, "--root", RUNTIME_ROOT, *argv, **kwargs)


def detached(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    """Start a detached container. Its stdio is /dev/null (CRIU cannot dump host files or our
    pipes as a container's stdio), so the runtime's errors come through its --log file."""
    log = cwd / "runtime.log"
    with open(os.devnull, "r+b") as null:
        result = subprocess.run([RUNTIME, "--root", RUNTIME_ROOT, "--log", str(log), *argv], stdin=null,
                                stdout=null, stderr=null, cwd=cwd, timeout=120, env=env)
    assert result.returncode == 0, log.read_text() if log.exists() else f"exit {result.returncode}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def docker_registry(directory: Path) -> Iterator[int]:
    """Debian's docker-registry serving plain HTTP on 127.0.0.1, its storage in `directory`; the port."""
    port = free_port()
    (directory / "registry-data").mkdir()
    config = directory / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {directory / 'registry-data'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    server = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield port
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


@contextlib.contextmanager
def configured_delegate(name: str, more: str = "") -> Iterator[str]:
    """/etc/gpuckpt/config.toml names this delegate (and holds `more`) for the block; the old file comes back after."""
    if os.geteuid() != 0:
        pytest.fail("integration tests need root (run them through integration/test.sh)")
    saved = CONFIG.read_text() if CONFIG.exists() else None
    CONFIG.parent.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(f'delegate = "{name}"\n{more}')
    CONFIG.chmod(0o644)
    try:
        yield name
    finally:
        if saved is None:
            CONFIG.unlink()
        else:
            CONFIG.write_text(saved)


# The note of every trust-policy exception a test run adds names the run's pytest process: what a killed run
# left (SIGKILL, a machine stopped) is found by it and removed at the next run's start (conftest.py).
TRUST_NOTE_MARK = re.compile(r"\[pytest pid (\d+)\]$")


@contextlib.contextmanager
def unsigned_allowed_on_node(*sources: str, note: str) -> Iterator[None]:
    """The node's trust policy (/etc/gpuckpt/trust.toml, which podman's restores read through the shim) holds
    an exception for each of `sources` (archive:PATH, restore:any) for the block: what the block added is
    removed whatever ends it (a failure, Ctrl-C, SIGTERM; conftest.py makes SIGTERM end the run as Ctrl-C does)."""
    added: list[str] = []
    try:
        for source in sources:
            sh(GPUCKPT, "trust", "allow-unsigned", source, "--note", f"{note} [pytest pid {os.getpid()}]")
            added.append(source)
        yield
    finally:
        failed = [f"{source}: {result.stderr.strip()}" for source in added
                  if (result := sh(GPUCKPT, "trust", "disallow-unsigned", source, check=False)).returncode != 0]
        assert not failed, f"trust exceptions not removed: {'; '.join(failed)}"


def remove_left_trust_exceptions() -> list[str]:
    """The node's trust exceptions added by a test run whose pytest process is gone, removed (named: the sources)."""
    listed = json.loads(sh(GPUCKPT, "trust", "list", "--json").stdout)
    removed = []
    for exception in listed["unsigned_allowed"]:
        mark = TRUST_NOTE_MARK.search(exception["note"])
        if mark is None or _is_pytest(int(mark[1])):
            continue
        sh(GPUCKPT, "trust", "disallow-unsigned", exception["source"])
        removed.append(exception["source"])
    return removed


def _is_pytest(pid: int) -> bool:
    try:
        return b"pytest" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# A cgroup v1 hierarchy mounted nowhere: mounted in a private mount namespace, a cgroup made in it,
# unmounted. The hierarchy lives on (it has a cgroup) and every process has a line for it in
# /proc/self/cgroup, the first one (host/cgroup_v1.py says what crun's restore does with it).
_STALE_CGROUP = "left-by-a-test"


def make_stale_hierarchy(options: str) -> None:
    sh("unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
       'd=$(mktemp -d) && mount -t cgroup -o "$1" cgroup "$d" && mkdir "$d/$2" && umount "$d" && rmdir "$d"',
       "_", options, _STALE_CGROUP)


def remove_stale_hierarchies() -> list[str]:
    """Every cgroup v1 hierarchy mounted nowhere under /sys/fs/cgroup, removed (named: the ones removed).
    Left by a container's systemd or by CRIU's cgroup yard, one makes every crun restore a refusal."""
    removed = []
    for controllers in stale_hierarchies():
        remove_stale_hierarchy(controllers if not controllers.startswith("name=") else f"none,{controllers}")
        removed.append(controllers)
    return removed


def remove_stale_hierarchy(options: str, timeout_s: float = 30) -> None:
    """Its cgroups removed, deepest first; the kernel lets an empty hierarchy go when it is unmounted,
    and a cgroup removed a moment ago may still count: mounted and unmounted again until it is gone."""
    controllers = options.removeprefix("none,")
    deadline = time.monotonic() + timeout_s
    while f":{controllers}:" in Path("/proc/self/cgroup").read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"the cgroup hierarchy {controllers} is still there after {timeout_s} s")
        sh("unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
           'd=$(mktemp -d) && mount -t cgroup -o "$1" cgroup "$d" && '
           'find "$d" -mindepth 1 -depth -type d -exec rmdir {} +; umount "$d"; rmdir "$d"', "_", options)
        time.sleep(0.2)


# (entry name, its data or None when the archive lacks it) -> the data to write, or None to leave it out
ArchiveEdit = Callable[[str, bytes | None], bytes | None]


def edited_archive(archive: Path, out: Path, edit: ArchiveEdit, added: tuple[str, ...] = ()) -> Path:
    """A zstd archive (or image layer) with each file entry's data passed through `edit`; the `added`
    entries are asked for at the end: an attacker's copy of a real export."""
    with open(archive, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as source, \
            tarfile.open(fileobj=source, mode="r|") as tar_in, open(out, "wb") as sink, \
            zstandard.ZstdCompressor().stream_writer(sink) as compressed, \
            tarfile.open(fileobj=compressed, mode="w|", format=tarfile.PAX_FORMAT) as tar_out:
        for member in tar_in:
            data = tar_in.extractfile(member).read() if member.isfile() else None
            if member.isfile():
                data = edit(member.name, data)
                if data is None:
                    continue
                member.size = len(data)
            tar_out.addfile(member, io.BytesIO(data) if data is not None else None)
        for name in added:
            data = edit(name, None)
            if data is not None:
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o600
                tar_out.addfile(info, io.BytesIO(data))
    return out


def edited_specs(change: Callable[[dict], dict]) -> ArchiveEdit:
    """An edit of spec.dump and of config.dump's spec by `change`, all else as exported."""
    def edit(name: str, data: bytes | None) -> bytes | None:
        if data is None or name not in ("spec.dump", "config.dump"):
            return data
        document = json.loads(data)
        if name == "spec.dump":
            return json.dumps(change(document)).encode()
        document["spec"] = change(document["spec"])
        return json.dumps(document).encode()
    return edit


def staging_leftovers() -> list[str]:
    """What gpuckpt import stages and records, left on the node."""
    imports = Path("/run/gpuckpt/imports")
    return ([p for p in os.listdir("/var/lib/containers") if p.startswith(".gpuckpt-import-")]
            + (os.listdir(imports) if imports.exists() else []))


def containers_named(name: str) -> str:
    return sh("podman", "ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Names}} {{.Status}}").stdout.strip()
