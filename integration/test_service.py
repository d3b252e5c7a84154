"""gpuckptd under real podman: containers recorded by gpuckpt-hook are drained through podman
into the archive directory, and restored when the service starts again, going on from their state.

The service runs as a plain process here (this machine's PID 1 is not systemd), with a config of
the test's own (archive directory, socket) and NOTIFY_SOCKET pointing at a datagram socket the
test reads, so READY and STATUS are seen as systemd would see them. The containers carry
io.gpuckpt.inventory=true: CPU containers the hook records as it records GPU ones.
"""

from __future__ import annotations

import http.server
import itertools
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bed import COUNTER_SOURCE, GPUCKPT, PODMAN_IMAGE, RUNTIME, assert_continues, sh, wait_counter

pytestmark = pytest.mark.integration
GPUCKPTD = str(Path(RUNTIME).parent / "gpuckptd")
_names = itertools.count()


class Service:
    """gpuckptd started with the test's config; what it told "systemd"."""

    def __init__(self, node: Path) -> None:
        self.node = node
        self.env = dict(os.environ, GPUCKPT_CONFIG=str(node / "config.toml"), NOTIFY_SOCKET=str(node / "notify"))
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(node / "notify"))
        self.notify.settimeout(120)
        self.process: subprocess.Popen | None = None

    def start(self, *options: str) -> list[str]:
        """Start it (with `options`); the notifications up to READY=1."""
        self.process = subprocess.Popen([GPUCKPTD, *options], env=self.env,
                                        stderr=open(self.node / "gpuckptd.log", "ab"))
        seen: list[str] = []
        while not any("READY=1" in message for message in seen):
            seen.append(self.notify.recv(4096).decode())
        return seen

    def stop(self, signum: int = signal.SIGTERM) -> list[str]:
        """SIGTERM (systemctl stop), or `signum`; the notifications until it exits."""
        assert self.process is not None
        self.process.send_signal(signum)
        self.process.wait(timeout=300)
        self.notify.settimeout(0.5)
        seen = []
        try:
            while True:
                seen.append(self.notify.recv(4096).decode())
        except TimeoutError:
            pass
        self.notify.settimeout(120)
        return seen

    def cli(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh(GPUCKPT, *argv, env=self.env, check=check)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def service(runc_delegate, tmp_path: Path) -> Iterator[Service]:
    config = tmp_path / "config.toml"
    config.write_text(f'delegate = "runc"\n[service]\narchive_dir = "{tmp_path / "archive"}"\n'
                      f'socket = "{tmp_path / "gpuckptd.sock"}"\n')
    config.chmod(0o644)
    running = Service(tmp_path)
    yield running
    running.kill()


def add_service_config(node: Path, lines: str) -> None:
    config = node / "config.toml"
    config.write_text(config.read_text() + lines)


@pytest.fixture
def counters() -> Iterator[list[str]]:
    names = [f"gpuckpt-svc-{os.getpid()}-{next(_names)}" for _ in range(3)]
    for name in names:
        sh("podman", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
           "--annotation", "io.gpuckpt.inventory=true", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
    yield names
    sh("podman", "rm", "-f", "-t", "0", *names, check=False)


def state_reader(name: str):
    return lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout


def container_id(name: str) -> str:
    return sh("podman", "inspect", "--format", "{{.Id}}", name).stdout.strip()


def test_drain_then_restore_when_the_service_starts_again(service, counters, tmp_path) -> None:
    started = service.start()
    assert any("STATUS=serving" in message for message in started), started
    status = service.cli("service", "status", "--json")
    recorded = json.loads(status.stdout)["recorded"]
    ids = {container_id(name): name for name in counters}
    assert set(ids) <= set(recorded)
    before = {name: wait_counter(state_reader(name), minimum=3) for name in counters}
    drained = service.cli("drain", "--json")
    events = [json.loads(line) for line in drained.stdout.splitlines()]
    done = {event["id"] for event in events if event["event"] == "container" and event["state"] == "done"}
    assert set(ids) <= done, drained.stdout
    named = {event["id"]: event["name"] for event in events if event["event"] == "container"}
    assert all(named[cid] == name for cid, name in ids.items()), named  # the engine's name, as podman ps
    assert events[-1]["event"] == "result" and events[-1]["ok"], events[-1]
    for name in counters:
        assert sh("podman", "inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "false"
    for cid in ids:
        record = json.loads((tmp_path / "archive" / f"{cid}.json").read_text())
        assert record["engine"] == "podman" and record["bytes"] > 0 and Path(record["checkpoint"]).is_file()
    stopping = service.stop()
    assert any("STOPPING=1" in message for message in stopping), stopping
    restarted = service.start()
    assert any("STATUS=restoring 3 drained container(s)" in m or "STATUS=restoring" in m for m in restarted), restarted
    for name in counters:
        after = assert_continues(before[name], state_reader(name))
        assert after.token == before[name].token
    assert not list((tmp_path / "archive").glob("*.json")), "the records of restored containers are removed"
    log = (tmp_path / "gpuckptd.log").read_text()
    assert "CONTAINER_ID=" in log and "PHASE=checkpoint" in log and "PHASE=restore" in log and "BYTES=" in log
    assert all(f"checkpoint of podman container {name} ({cid[:12]}) started" in log for cid, name in ids.items())


def test_drain_under_a_deadline_reports_what_it_could_not_start(service, counters, tmp_path) -> None:
    service.start()
    # A deadline passed before anything starts: every container is skipped and left running.
    drained = service.cli("drain", "--deadline", "0.000001", "--json")
    events = [json.loads(line) for line in drained.stdout.splitlines()]
    skipped = {event["id"] for event in events if event["event"] == "container" and event["state"] == "skipped"}
    assert {container_id(name) for name in counters} <= skipped
    assert all("deadline" in event["message"] for event in events if event["event"] == "container")
    for name in counters:
        assert sh("podman", "inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"


@pytest.mark.hostile("a non-root local user asking gpuckptd to drain the node")
def test_only_root_may_use_the_socket(service, tmp_path) -> None:
    reachable = Path(f"/tmp/gpuckpt-sock-{os.getpid()}")  # pytest's own directories are root's alone
    reachable.mkdir(mode=0o755, exist_ok=True)
    config = tmp_path / "config.toml"
    config.write_text(config.read_text().replace(str(tmp_path / "gpuckptd.sock"), str(reachable / "gpuckptd.sock")))
    service.start()
    path = reachable / "gpuckptd.sock"
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o666)  # an operator's slip: the service still answers only root
    client = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
              "s.sendall(b'{\"op\": \"drain\"}\\n'); print(s.makefile().read())")
    result = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3",
                             "-c", client, str(path)], capture_output=True, text=True, timeout=60)
    assert json.loads(result.stdout) == {"event": "result", "ok": False, "message":
                                         "gpuckptd: only root may use this socket", "done": [], "failed": [],
                                         "skipped": []}, result
    service.kill()
    path.unlink(missing_ok=True)
    reachable.rmdir()


class MetadataService:
    """A loopback HTTP server playing a cloud's metadata service: `answer` is (status, body) now."""

    def __init__(self) -> None:
        self.answer: tuple[int, bytes] = (404, b"")
        self.requests: list[tuple[str, dict[str, str]]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                outer.requests.append((self.path, dict(self.headers)))
                status, body = outer.answer
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:  # noqa: N802 (IMDSv2's token: this "cloud" has none)
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url_base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.mark.parametrize("cloud", ["gce", "aws"])
def test_preemption_notice_drains_before_its_deadline(service, counters, tmp_path, cloud) -> None:
    metadata = MetadataService()
    path = {"gce": "/computeMetadata/v1/instance/preempted", "aws": "/latest/meta-data/spot/instance-action"}[cloud]
    metadata.answer = (200, b"FALSE") if cloud == "gce" else (404, b"")
    add_service_config(tmp_path, f'preemption_url = "{metadata.url_base}{path}"\npreemption_poll_s = 0.5\n'
                                 "drain_on_stop = false\n")
    try:
        service.start()
        time.sleep(1.5)  # polled, no notice: everything keeps running
        assert metadata.requests and all(sh("podman", "inspect", "--format", "{{.State.Running}}", name)
                                         .stdout.strip() == "true" for name in counters)
        if cloud == "gce":
            assert metadata.requests[0][1].get("Metadata-Flavor") == "Google"
            metadata.answer = (200, b"TRUE")
        else:
            notice_time = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
            metadata.answer = (200, json.dumps({"action": "terminate", "time": notice_time}).encode())
        noticed = time.monotonic()
        deadline = time.monotonic() + 120
        ids = {container_id(name) for name in counters}
        while time.monotonic() < deadline:
            if all((tmp_path / "archive" / f"{cid}.json").exists() for cid in ids):
                break
            time.sleep(0.5)
        drained_s = time.monotonic() - noticed
        log = (tmp_path / "gpuckptd.log").read_text()
        assert all((tmp_path / "archive" / f"{cid}.json").exists() for cid in ids), log
        assert drained_s < 30, drained_s
        assert "preemption notice" in log and "made it:" in log
    finally:
        metadata.close()


def test_preemption_file_and_periodic_checkpoints_keep_the_newest(service, tmp_path) -> None:
    name = f"gpuckpt-svc-{os.getpid()}-{next(_names)}"
    sh("podman", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
       "--annotation", "io.gpuckpt.inventory=true", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)
    try:
        add_service_config(tmp_path, "checkpoint_every_min = 0.05\ncheckpoint_keep = 2\n"
                                     f'preemption_file = "{tmp_path / "preempt"}"\ndrain_on_stop = false\n')
        service.start()
        before = wait_counter(state_reader(name), minimum=3)
        periodic = tmp_path / "archive" / "periodic" / container_id(name)
        deadline = time.monotonic() + 90
        log_path = tmp_path / "gpuckptd.log"
        while time.monotonic() < deadline and log_path.read_text().count("periodic checkpoint /") < 3:
            time.sleep(1)
        assert log_path.read_text().count("periodic checkpoint /") >= 3, log_path.read_text()
        assert len(list(periodic.glob("*.tar.zst"))) == 2  # the newest two of three or more
        after = assert_continues(before, state_reader(name))  # --leave-running: it never stopped
        (tmp_path / "preempt").touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (tmp_path / "archive" / f"{container_id(name)}.json").exists():
            time.sleep(0.5)
        assert (tmp_path / "archive" / f"{container_id(name)}.json").exists(), log_path.read_text()
        assert after.token == before.token
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


# The tests below leave /etc/gpuckpt/config.toml as the node has it (its delegate is the runtime's) and give
# gpuckptd an inventory of its own (GPUCKPT_INVENTORY_DIR): other engineers' containers, recorded in the node's
# /run/gpuckpt/containers, are never drained by them. `adopt` copies a container's record from there.
NODE_INVENTORY = Path("/run/gpuckpt/containers")


@pytest.fixture
def own_service(tmp_path: Path) -> Iterator[Service]:
    config = tmp_path / "config.toml"
    config.write_text(f'delegate = "runc"\n[service]\narchive_dir = "{tmp_path / "archive"}"\n'
                      f'socket = "{tmp_path / "gpuckptd.sock"}"\n')
    config.chmod(0o644)
    running = Service(tmp_path)
    running.env.update(GPUCKPT_INVENTORY_DIR=str(tmp_path / "inventory"))
    yield running
    running.kill()


def adopt(node: Path, name: str) -> str:
    """The container's record copied from the node's inventory into the test service's; its ID."""
    cid = container_id(name)
    deadline = time.monotonic() + 30
    while not (NODE_INVENTORY / f"{cid}.json").exists():  # written by gpuckpt-hook as the container starts
        assert time.monotonic() < deadline, f"no record of {name} in {NODE_INVENTORY}"
        time.sleep(0.2)
    inventory = node / "inventory"
    inventory.mkdir(parents=True, mode=0o700, exist_ok=True)
    (inventory / f"{cid}.json").write_bytes((NODE_INVENTORY / f"{cid}.json").read_bytes())
    return cid


def run_counter(name: str) -> None:
    sh("podman", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none",
       "--annotation", "io.gpuckpt.inventory=true", PODMAN_IMAGE, "python3", "-c", COUNTER_SOURCE)


def running(name: str) -> bool:
    return sh("podman", "inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"


def wait_for(what: str, done, timeout_s: float = 60, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s" + (
            f"\n{log.read_text()}" if log else "")
        time.sleep(0.3)


def test_a_stop_drains_nothing_unless_drain_on_stop_is_given(own_service, tmp_path) -> None:
    name = f"gpuckpt-svc-{os.getpid()}-{next(_names)}"
    run_counter(name)
    try:
        cid = adopt(tmp_path, name)
        own_service.start()
        began = time.monotonic()
        own_service.stop(signal.SIGINT)  # Ctrl-C in the foreground
        assert own_service.process.returncode == 0 and time.monotonic() - began < 10
        assert running(name) and not (tmp_path / "archive" / f"{cid}.json").exists()
        log = (tmp_path / "gpuckptd.log").read_text()
        assert "a stop drains nothing" in log and "gpuckptd --drain-on-stop drains at stop" in log, log
        own_service.start()
        own_service.stop(signal.SIGTERM)
        assert running(name) and not (tmp_path / "archive" / f"{cid}.json").exists()

        own_service.start("--drain-on-stop")  # the systemd unit's command: the node shutting down
        own_service.stop(signal.SIGTERM)
        assert (tmp_path / "archive" / f"{cid}.json").exists(), (tmp_path / "gpuckptd.log").read_text()
        assert not running(name)
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)


def status(service: Service) -> dict:
    return json.loads(service.cli("service", "status", "--json").stdout)


def test_preemption_is_shown_cleared_by_reset_and_a_later_notice_drains_again(own_service, tmp_path) -> None:
    name = f"gpuckpt-svc-{os.getpid()}-{next(_names)}"
    metadata = MetadataService()
    path = "/computeMetadata/v1/instance/preempted"
    metadata.answer = (200, b"FALSE")
    add_service_config(tmp_path, f'preemption_url = "{metadata.url_base}{path}"\npreemption_poll_s = 0.5\n'
                                 "checkpoint_every_min = 0.05\ncheckpoint_keep = 2\n")
    log = tmp_path / "gpuckptd.log"
    run_counter(name)
    cid = None
    try:
        cid = adopt(tmp_path, name)
        drained = tmp_path / "archive" / f"{cid}.json"
        own_service.start()
        wait_for("a periodic checkpoint", lambda: log.read_text().count("periodic checkpoint /") >= 1, log=log)
        assert f": podman container {name} ({cid[:12]})" in log.read_text(), log.read_text()  # named, not an ID
        shown = status(own_service)
        assert shown["names"] == {cid: name}, shown
        assert shown["preemption"]["state"] == "watching" and shown["drains_on_stop"] is False
        assert shown["preemption"]["sources"] == [f"{metadata.url_base}{path}", "SIGUSR1"]
        (scheduled,) = [item for item in shown["periodic"]["containers"] if item["id"] == cid]
        assert scheduled["every_min"] == 0.05 and scheduled["next_at"] and scheduled["last"].endswith(".tar.zst")
        assert shown["periodic"]["paused"] == ""
        text = own_service.cli("service", "status").stdout
        assert f"preemption: watching {metadata.url_base}{path}, SIGUSR1" in text, text
        assert f"  {name} ({cid[:12]}) (podman) every 0.05 min, last " in text, text  # its name, not its ID alone
        assert "periodic checkpoints: every 0 min" not in text, text

        metadata.answer = (200, b"TRUE")
        wait_for("the preemption's drain", drained.exists, log=log)
        wait_for("the drain's end", lambda: status(own_service)["preemption"]["state"] == "drained", log=log)
        shown = status(own_service)["preemption"]
        assert shown["source"].startswith(f"{metadata.url_base}{path}: ") and shown["noticed_at"]
        assert shown["deadline_at"] > shown["noticed_at"] and shown["drain"].startswith("drain: 1 done"), shown
        assert "paused" not in shown and status(own_service)["periodic"]["paused"]
        periodic_lines = log.read_text().count("periodic checkpoint")
        text = own_service.cli("service", "status").stdout
        assert "preemption: drained: notice at " in text and "`gpuckpt service reset` clears it" in text, text
        print(f"gpuckpt service status, preemption pending:\n{text}")

        refused = own_service.cli("service", "reset", check=False)  # the metadata service still says TRUE
        assert refused.returncode == 3 and refused.stdout == "", refused  # refused: one line on stderr
        assert refused.stderr.startswith("gpuckpt service: not cleared: ") and "still gives notice" in refused.stderr
        metadata.answer = (200, b"FALSE")
        time.sleep(1.5)
        assert periodic_lines == log.read_text().count("periodic checkpoint"), "periodic checkpoints wait meanwhile"
        cleared = own_service.cli("service", "reset")
        assert "watching again" in cleared.stdout, cleared.stdout
        assert status(own_service)["preemption"]["state"] == "watching"
        own_service.cli("service", "restore")
        assert running(name) and not drained.exists()
        wait_for("periodic checkpoints resumed",
                 lambda: log.read_text().count("periodic checkpoint /") > periodic_lines, log=log)

        metadata.answer = (200, b"TRUE")  # a later notice: a preemption of its own
        wait_for("the second preemption's drain", drained.exists, log=log)
        assert log.read_text().count("preemption notice") == 2
    finally:
        metadata.close()
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
        if cid:  # restored by podman, so no poststop hook removed its record from the node's inventory
            (NODE_INVENTORY / f"{cid}.json").unlink(missing_ok=True)


def test_the_record_of_a_container_removed_after_an_import_is_dropped(own_service, tmp_path) -> None:
    name = f"gpuckpt-svc-{os.getpid()}-{next(_names)}"
    imported = f"{name}-imported"
    archive = tmp_path / "moved.tar.zst"
    run_counter(name)
    cid = None
    try:
        wait_counter(state_reader(name), minimum=2)
        sh(GPUCKPT, "export", name, "-o", str(archive), timeout=300)
        sh("podman", "rm", "-f", "-t", "0", name)
        sh(GPUCKPT, "import", "--trust-config", "--name", imported, str(archive), timeout=300)
        cid = adopt(tmp_path, imported)
        sh("podman", "rm", "-f", "-t", "0", imported)
        # what the node's inventory kept: podman runs no poststop hook for a container it restored
        left_on_node = (NODE_INVENTORY / f"{cid}.json").exists()
        add_service_config(tmp_path, "checkpoint_every_min = 0.05\n")
        own_service.start()
        log = tmp_path / "gpuckptd.log"
        wait_for("the record dropped", lambda: not (tmp_path / "inventory" / f"{cid}.json").exists(),
                 timeout_s=20, log=log)
        time.sleep(4)  # an interval past: nothing tries it
        text = log.read_text()
        assert "the container no longer exists: its record removed" in text and f"CONTAINER_ID={cid}" in text
        assert "periodic checkpoint failed" not in text, text
        assert cid not in status(own_service)["recorded"]
        print(f"the node's inventory kept the removed container's record: {left_on_node}")
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, imported, check=False)
        if cid:
            (NODE_INVENTORY / f"{cid}.json").unlink(missing_ok=True)  # the node's leftover, put back as it was


def test_a_periodic_checkpoint_restores_as_a_moved_container_without_trust_config(own_service, tmp_path) -> None:
    """node.md: `gpuckpt import ARCHIVE --name NEW` restores this node's own periodic checkpoint (signed by the
    node's key, which it trusts: no --trust-config, no trust change); the copy goes on from the checkpoint."""
    name = f"gpuckpt-svc-{os.getpid()}-{next(_names)}"
    copy = f"{name}-copy"
    add_service_config(tmp_path, "checkpoint_every_min = 0.05\n")
    log = tmp_path / "gpuckptd.log"
    run_counter(name)
    cid = copy_id = None
    try:
        cid = adopt(tmp_path, name)
        before = wait_counter(state_reader(name), minimum=2)
        own_service.start()
        wait_for("a periodic checkpoint", lambda: log.read_text().count("periodic checkpoint /") >= 1, log=log)
        own_service.stop(signal.SIGINT)  # no later checkpoint meanwhile
        archive = sorted((tmp_path / "archive" / "periodic" / cid).glob("*.tar.zst"))[-1]
        restored = sh(GPUCKPT, "import", str(archive), "--name", copy, timeout=300)
        assert restored.stdout.startswith(f"restored {copy} ("), restored.stdout
        copy_id = container_id(copy)
        assert_continues(before, state_reader(copy))
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, copy, check=False)
        for each in (cid, copy_id):  # the copy was restored by podman: no poststop hook removes its record
            if each:
                (NODE_INVENTORY / f"{each}.json").unlink(missing_ok=True)
