"""gpuckpt-runtimed, the resident helper: owned verbs worked by its worker while the delegate, and every
program the verb runs, stays the calling gpuckpt-runtime's child."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import marshal
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from resident_runtime import children_of
from support import REPO, build_launcher, python_calls, write_config

import gpuckpt
from gpuckpt.host import process
from gpuckpt.shim.resident import call as resident_call
from gpuckpt.shim.resident import caller, messages
from gpuckpt.shim.resident import server as resident

# Where the tests' gpuckpt is imported from: the helper and the callers must load the same files (its identity).
IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gpuckpt.__file__)))
CALLER_UMASK = 0o027
# Ignored by Python for itself: a program started by the caller (a Python) must get them at their defaults.
PYTHONS_IGNORED = 1 << signal.SIGPIPE - 1 | 1 << signal.SIGXFSZ - 1


@pytest.fixture
def runtime(node: Path) -> Path:
    """The stand-in delegate (tests/resident_runtime.py) in the node's config; callers run in node/cwd."""
    script = node / "bin" / "runc"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\n" + Path(__file__).with_name("resident_runtime.py").read_text())
    script.chmod(0o755)
    (node / "rec").mkdir()
    (node / "cwd").mkdir()
    write_config(node, f'delegate = "{script}"\n')
    return script


def start_listener(node: Path, argv: list[str]) -> subprocess.Popen:
    """`argv` started, and listening on the helper's socket in the node's state directory (its output in
    node/helper.log)."""
    with open(node / "helper.log", "w") as log:
        started = subprocess.Popen(argv, stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": IMPORT_ROOT},
                                   start_new_session=True)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
            try:
                probe.connect(str(node / "state" / resident_call.SOCKET_NAME))
                break
            except OSError:
                assert started.poll() is None and time.monotonic() < deadline, (node / "helper.log").read_text()
                time.sleep(0.02)
    return started


@pytest.fixture
def helper(node: Path, runtime: Path) -> Iterator[subprocess.Popen]:
    started = start_listener(node, [sys.executable, "-m", "gpuckpt.shim.resident.server"])
    yield started
    with contextlib.suppress(ProcessLookupError):  # a test that ended the helper and its spare itself
        os.killpg(started.pid, signal.SIGKILL)  # the helper and any worker a broken test left
    started.wait()


def needs_cc() -> None:
    if shutil.which("cc") is None or not Path("/usr/include/zlib.h").exists():
        pytest.skip("no cc or zlib.h: run integration/testbed/install-system.sh (gcc, zlib1g-dev)")


@pytest.fixture(scope="module")
def launcher_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The compiled launcher of this tree (shim/resident/), and the file its interpreter's starts are noted in."""
    needs_cc()
    return build_launcher(tmp_path_factory.mktemp("launcher"), IMPORT_ROOT)


Call = Callable[..., subprocess.Popen]


@pytest.fixture(params=["python", "compiled"])
def call(request: pytest.FixtureRequest, node: Path, runtime: Path) -> Call:
    """gpuckpt-runtime as an engine starts it, in node/cwd with a umask and a variable of its own: the
    Python shim, or the compiled launcher, which hands owned verbs over itself (shim/resident/resident_call.c)."""
    command = [sys.executable, "-m", "gpuckpt.shim.main"]
    if request.param == "compiled":
        built, _ = request.getfixturevalue("launcher_build")
        command = [str(built)]
        warm = subprocess.run([*command, "state", "warm"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "REC_DIR": str(node / "rec")})
        assert warm.returncode == 0, warm.stderr  # the delegate cache the launcher reads, written by the shim
        (node / "rec" / "state.json").unlink()
    locks = node / "state" / "locks"  # c1's: without one, the compiled launcher passes a runc delete through
    locks.mkdir(mode=0o700, parents=True, exist_ok=True)
    (locks / "c1.lock").touch()

    def started(node: Path, argv: list[str], *, wrapper: Sequence[str] = (),
                preexec_fn: Callable[[], object] | None = None, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            [*wrapper, *command, *argv], cwd=node / "cwd", umask=CALLER_UMASK, text=True, preexec_fn=preexec_fn,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={
                **os.environ, "PYTHONPATH": IMPORT_ROOT, "REC_DIR": str(node / "rec"), "REC_MARK": "the caller's",
                **env})
    return started


def cwd_of(node: Path) -> str:
    return os.path.realpath(node / "cwd")  # as /proc shows it


def recorded(node: Path, verb: str) -> dict:
    return json.loads((node / "rec" / f"{verb}.json").read_text())


def workers_for(node: Path, verb: str) -> list[dict]:
    """The helper's children in the caller's working directory while the delegate ran: its worker, if any."""
    return [worker for worker in recorded(node, verb)["workers"] if worker["cwd"] == cwd_of(node)]


def wait_for(path: Path, running: subprocess.Popen) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert running.poll() is None and time.monotonic() < deadline, f"no {path.name}; caller: {running.poll()}"
        time.sleep(0.01)


def test_an_owned_verb_is_worked_by_a_worker_that_becomes_the_caller(node, helper, call: Call) -> None:
    shim = call(node, ["delete", "c1"], REC_HELPER=str(helper.pid))
    out, err = shim.communicate(timeout=30)
    assert shim.returncode == 0, err
    assert (out, err) == ("delete out\n", "delete err\n")  # the delegate's stdio: the caller's
    delegate = recorded(node, "delete")
    assert delegate["argv"] == ["delete", "c1"] and delegate["ppid"] == shim.pid  # the engine's grandchild
    assert (delegate["cwd"], delegate["umask"], delegate["mark"]) == (cwd_of(node), CALLER_UMASK, "the caller's")
    [worker] = workers_for(node, "delete")  # the helper's child took the caller's working directory...
    assert worker["umask"] == CALLER_UMASK and worker["pid"] not in (shim.pid, helper.pid)  # ... and umask
    assert f"gpuckpt-runtimed: delete c1 for pid {shim.pid}: exit 0 in " in (node / "helper.log").read_text()


@pytest.mark.parametrize("call", ["compiled"], indirect=True)  # the Python shim is a Python start by definition
def test_the_compiled_launcher_hands_an_owned_verb_over_without_starting_python(node, helper, call: Call,
                                                                               launcher_build) -> None:
    calls = launcher_build[1]
    before = python_calls(calls)
    assert before >= 1  # the fixture's warm-up (no delegate cache yet) started the interpreter: starts are counted
    shim = call(node, ["--root", "/r", "delete", "c1"], REC_HELPER=str(helper.pid))
    out, err = shim.communicate(timeout=30)
    assert (shim.returncode, out, err) == (0, "delete out\n", "delete err\n")
    assert recorded(node, "delete")["ppid"] == shim.pid and len(workers_for(node, "delete")) == 1
    assert python_calls(calls) == before  # the C caller reached the helper itself


def test_the_delegates_status_and_the_verbs_error_line_reach_the_caller(node, helper, call: Call) -> None:
    shim = call(node, ["--root", "/r", "delete", "c1"], REC_HELPER=str(helper.pid), REC_STATUS="3")
    out, err = shim.communicate(timeout=30)
    assert shim.returncode == 3
    lines = err.splitlines()  # the delegate's line, then the worker's on the caller's stderr
    assert lines[0] == "delete err" and lines[-1] == "container c1 does not exist"
    assert out == "delete out\n"  # `state`'s output was the worker's to read, not the caller's
    state = recorded(node, "state")  # run by the worker's process.run: started by the caller all the same
    assert state["argv"] == ["--root", "/r", "state", "c1"] and state["ppid"] == shim.pid
    assert len(workers_for(node, "delete")) == 1


def test_a_caller_that_asks_for_its_own_process_works_the_verb_itself(node, helper, call: Call) -> None:
    shim = call(node, ["delete", "c1"], REC_HELPER=str(helper.pid), GPUCKPT_RESIDENT="0")
    out, err = shim.communicate(timeout=30)
    assert shim.returncode == 0, err
    assert out == "delete out\n" and recorded(node, "delete")["ppid"] == shim.pid
    assert workers_for(node, "delete") == []  # the helper untouched


def test_with_no_helper_listening_the_caller_works_the_verb_itself(node, runtime, call: Call) -> None:
    (node / "state").mkdir(mode=0o700, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as left:  # a helper's socket, nobody on it
        left.bind(str(node / "state" / resident_call.SOCKET_NAME))
    shim = call(node, ["delete", "c1"], REC_STATUS="2")
    out, err = shim.communicate(timeout=30)
    assert shim.returncode == 2
    assert out == "delete out\n" and err.endswith("\ncontainer c1 does not exist\n")
    assert recorded(node, "delete")["ppid"] == shim.pid


# A listener that answers as a worker would and has its caller start a program of its choosing; in the wire's
# marshal version (2), which the compiled caller reads: a caller that refuses it refuses the listener, not its words.
IMPOSTOR = """import marshal, os, socket, sys
from gpuckpt.shim.resident.caller import Caller
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(sys.argv[1])
listener.listen()
while True:
    connection, _ = listener.accept()
    if connection.recv(1 << 20):
        connection.send(marshal.dumps(("worker", os.getpid()), 2))
        Caller(connection).spawn(["touch", sys.argv[2]]).wait()
        connection.send(marshal.dumps(("exit", 0), 2))
    connection.close()
"""


def test_a_listener_with_fewer_powers_than_the_caller_is_not_called(node, runtime, call: Call) -> None:
    """A root process without all of our capabilities could listen there and have callers start its programs."""
    if not shutil.which("setpriv"):
        pytest.skip("no setpriv to start a listener with fewer capabilities")
    (node / "state").mkdir(mode=0o700, exist_ok=True)
    lesser = start_listener(node, ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all", sys.executable, "-c",
                                   IMPOSTOR, str(node / "state" / resident_call.SOCKET_NAME), str(node / "took")])
    try:
        shim = call(node, ["delete", "c1"])
        out, err = shim.communicate(timeout=30)
        assert shim.returncode == 0, err
        assert not (node / "took").exists()  # its orders were not taken...
        assert recorded(node, "delete")["ppid"] == shim.pid  # ... and the verb was the caller's to work
    finally:
        os.killpg(lesser.pid, signal.SIGKILL)
        lesser.wait()


def test_a_listener_whose_queue_is_full_is_not_waited_for(node, runtime, call: Call) -> None:
    """A helper stopped or hung, its queue of calls full: connect() would wait for it as long as it stays so, and
    the engine with it (the first answer's 15 s only start once connected)."""
    (node / "state").mkdir(mode=0o700, exist_ok=True)
    path = str(node / "state" / resident_call.SOCKET_NAME)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener, \
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as queued:
        listener.bind(path)
        listener.listen(0)  # this process: root with all our powers, which never accepts
        queued.connect(path)  # the one call its queue holds
        shim = call(node, ["delete", "c1"])
        try:
            out, err = shim.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            shim.kill()
            shim.communicate()
            pytest.fail("the caller waited for a listener that does not accept")
    assert shim.returncode == 0, err
    assert out == "delete out\n" and recorded(node, "delete")["ppid"] == shim.pid  # worked by the caller itself


def test_a_caller_with_its_stdin_closed_works_the_verb_itself(node, helper, call: Call) -> None:
    """Its connection to the helper would take fd 0 and go to the worker as the caller's stdin: the worker would
    hold the caller's end itself, never see the caller killed, and wait for its answers forever."""
    shim = call(node, ["delete", "c1"], preexec_fn=lambda: os.close(0), REC_HELPER=str(helper.pid))
    out, err = shim.communicate(timeout=30)
    assert shim.returncode == 0, err
    assert out == "delete out\n" and recorded(node, "delete")["ppid"] == shim.pid
    assert workers_for(node, "delete") == []


# Runs argv[2:] with this process's environment and then the entry argv[1]: a name given twice (execve takes that)
EXEC_WITH_LATER_ENTRY = """import ctypes, os, sys
def strings(values):
    return (ctypes.c_char_p * (len(values) + 1))(*values, None)
entries = [os.fsencode(f"{name}={value}") for name, value in os.environ.items()] + [os.fsencode(sys.argv[1])]
ctypes.CDLL(None, use_errno=True).execve(os.fsencode(sys.argv[2]), strings([os.fsencode(a) for a in sys.argv[2:]]),
                                         strings(entries))
sys.exit(f"execve: {os.strerror(ctypes.get_errno())}")
"""


def test_a_name_twice_in_the_callers_environment_is_its_first_entry_for_the_worker(node, helper, call: Call) -> None:
    """As os.environ and getenv have it (the engine's environment is not checked for such things)."""
    shim = call(node, ["delete", "c1"], wrapper=[sys.executable, "-c", EXEC_WITH_LATER_ENTRY, "REC_MARK=a later one"],
                REC_HELPER=str(helper.pid))
    out, err = shim.communicate(timeout=30)
    assert shim.returncode == 0, err
    assert recorded(node, "delete")["mark"] == "the caller's" and len(workers_for(node, "delete")) == 1


def hello(node: Path, data: bytes, fds: list[int]) -> tuple:
    """The helper's answer to a call's first message."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(10)
        sock.connect(str(node / "state" / resident_call.SOCKET_NAME))
        sock.sendmsg([data], messages.pack_fds(fds))
        return marshal.loads(sock.recv(messages.MAX_MESSAGE))


def test_a_call_from_another_install_or_not_a_call_is_left_to_the_caller(node, runtime, helper, call: Call) -> None:
    def call_from(identity: str) -> bytes:
        return marshal.dumps(("call", resident_call.PROTOCOL, identity, "gpuckpt-runtime", ["delete", "c1"],
                              {"PATH": os.environ["PATH"]}, 0o22, str(runtime), ""))

    cwd = os.open(node / "cwd", os.O_PATH | os.O_DIRECTORY)
    try:
        other = resident_call.package_identity().replace(":", ":1", 1)  # another file, same path
        assert hello(node, call_from(other), [0, 1, 2, cwd]) == ("local", "another gpuckpt install")
        for data, fds in ((b"garbage", [0, 1, 2, cwd]), (call_from(resident_call.package_identity()), [0, 1, 2]),
                          (marshal.dumps(("call", resident_call.PROTOCOL + 1)), [0, 1, 2, cwd])):
            assert hello(node, data, fds) == ("local", "not a call this helper speaks")
    finally:
        os.close(cwd)
    state_call = marshal.dumps(("call", resident_call.PROTOCOL, resident_call.package_identity(), "gpuckpt-runtime",
                                ["state", "c1"], {"PATH": os.environ["PATH"]}, 0o22, str(runtime), ""))
    cwd = os.open(node / "cwd", os.O_PATH | os.O_DIRECTORY)
    try:  # a verb the shim passes through is not a worker's: the caller's own parse may differ (the C launcher's)
        assert hello(node, state_call, [0, 1, 2, cwd]) == ("local", "state is not an owned verb's call")
    finally:
        os.close(cwd)
    lazy_call = marshal.dumps(("call", resident_call.PROTOCOL, resident_call.package_identity(), "gpuckpt-runtime",
                               ["checkpoint", "--lazy-pages", "--status-fd", "7", "c1"], {"PATH": os.environ["PATH"]},
                               0o22, str(runtime), ""))
    cwd = os.open(node / "cwd", os.O_PATH | os.O_DIRECTORY)
    try:  # the engine's --status-fd is the caller's descriptor: a worker could not write runc's \0 to it
        assert hello(node, lazy_call, [0, 1, 2, cwd]) == (
            "local", "checkpoint with --status-fd (a descriptor of the caller's) is the caller's")
    finally:
        os.close(cwd)
    assert not (node / "rec" / "delete.json").exists()  # none of them worked
    assert "a call left to its caller: another gpuckpt install" in (node / "helper.log").read_text()
    shim = call(node, ["delete", "c1"], REC_HELPER=str(helper.pid))  # and the helper still serves
    assert shim.wait(timeout=30) == 0 and len(workers_for(node, "delete")) == 1


PEER = ("import socket, sys, time\nsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "sock.connect('\\0' + sys.argv[1])\ntime.sleep(10)\n")


@pytest.mark.parametrize(("wrapper", "user", "why"), [
    ([], 65534, "caller uid 65534"),
    (["setpriv", "--bounding-set", "-all", "--inh-caps", "-all"], None, "caller has fewer capabilities"),
    (["unshare", "--mount"], None, "caller in other namespaces"),
    (["setpriv", "--no-new-privs"], None, "caller is confined"),
])
def test_a_caller_without_all_of_roots_powers_is_refused(wrapper, user, why) -> None:
    if wrapper and not shutil.which(wrapper[0]):
        pytest.skip(f"no {wrapper[0]} to start a lesser caller with")
    name = f"gpuckpt-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        listener.bind("\0" + name)  # abstract: a path nobody's permissions keep out
        listener.listen()
        listener.settimeout(10)
        peer = subprocess.Popen([*wrapper, sys.executable, "-c", PEER, name], user=user)
        try:
            connection, _ = listener.accept()
            with connection, pytest.raises(resident.Refused, match=f"^{why}($| )"):
                resident.check_peer(connection)
        finally:
            peer.kill()
            peer.wait()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        resident.check_peer(ours)  # root, our namespaces and capabilities: taken


def test_a_spare_worker_waits_warmed_for_the_next_call_and_ends_with_the_helper(node, helper, call: Call) -> None:
    deadline = time.monotonic() + 10
    seen: list[list[int]] = []
    while len(seen) < 2 or len(seen[-1]) != 1 or seen[-1] != seen[-2]:  # the fixture's probe took a spare too
        assert time.monotonic() < deadline, f"not one spare worker: {seen[-1]}"
        seen.append(children_of(helper.pid))
        time.sleep(0.3)
    [spare] = seen[-1]
    shim = call(node, ["delete", "c1"], REC_HELPER=str(helper.pid))
    assert shim.wait(timeout=30) == 0
    [worker] = workers_for(node, "delete")
    assert worker["pid"] == spare  # forked before the call came: the call did not wait for a fork
    while not (spares := [pid for pid in children_of(helper.pid) if pid != spare]):
        assert time.monotonic() < deadline, "no next spare"
        time.sleep(0.02)
    os.kill(helper.pid, signal.SIGKILL)  # systemd's stop with KillMode=process ends the helper alone
    helper.wait()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{spares[0]}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{spares[0]}"), "an idle spare outlived its helper"


def test_a_signal_to_the_caller_reaches_the_delegate(node, helper, call: Call) -> None:
    shim = call(node, ["delete", "c1"], REC_HELPER=str(helper.pid), REC_SLEEP="delete")
    wait_for(node / "rec" / "ready", shim)
    assert len(workers_for(node, "delete")) == 1
    shim.send_signal(signal.SIGTERM)
    shim.communicate(timeout=10)
    assert (node / "rec" / "signal").read_text() == "SIGTERM"
    assert shim.returncode == 128 + signal.SIGTERM  # the delegate's status, as the shell reports it


@pytest.mark.parametrize(("sleeping", "waited_for"), [
    ("delete", True),  # the delegate: told by SIGTERM, and its end awaited before anything else (a rollback)
    ("state", False),  # a program whose output the worker reads (process.run): only the caller's end tells it
])
def test_a_worker_whose_caller_is_killed_ends(node, helper, sleeping, waited_for, call: Call) -> None:
    shim = call(node, ["delete", "c1"], REC_HELPER=str(helper.pid), REC_SLEEP=sleeping, REC_STATUS="1")
    wait_for(node / "rec" / "ready", shim)
    [worker] = workers_for(node, "delete")
    delegate = os.pidfd_open(recorded(node, sleeping)["pid"])  # an orphan once the caller is gone: ours to end
    try:
        shim.kill()
        shim.wait()
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{worker['pid']}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not os.path.exists(f"/proc/{worker['pid']}"), "the worker outlived its caller"
        if waited_for:
            assert select.select([delegate], [], [], 0)[0], "the worker ended before its delegate"
            assert (node / "rec" / "signal").read_text() == "SIGTERM"
    finally:
        signal.pidfd_send_signal(delegate, signal.SIGKILL)
        os.close(delegate)


SERVE = ("import os, socket, sys\nfrom gpuckpt.shim.resident import call\n"
         "os.set_inheritable(int(sys.argv[1]), False)  # as gpuckpt-runtime's connection\n"
         "sys.exit(call._serve(socket.socket(fileno=int(sys.argv[1]))))\n")


@pytest.fixture(scope="module")
def c_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled launcher's serving loop alone (tests/c/serve_fd.c)."""
    needs_cc()
    built = tmp_path_factory.mktemp("serve") / "serve_fd"
    subprocess.run(["cc", "-O1", "-Wall", "-Wextra", "-Werror", "-std=c11", "-o", str(built),
                    str(Path(__file__).parent / "c" / "serve_fd.c")], check=True)
    return built


@pytest.fixture(params=["python", "compiled"])
def served(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen]:
    """This process as a resident worker: its programs started by a gpuckpt-runtime's serving loop (the Python
    shim's or the compiled launcher's), which holds an fd of the engine's (server.engine_fd)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    engine_fd, engine_end = os.pipe()
    command = [sys.executable, "-c", SERVE]
    if request.param == "compiled":
        command = [str(request.getfixturevalue("c_server"))]
    with ours:
        with theirs:
            server = subprocess.Popen([*command, str(theirs.fileno())], pass_fds=[
                theirs.fileno(), engine_fd], env={**os.environ, "PYTHONPATH": IMPORT_ROOT})
        server.engine_fd = engine_fd  # type: ignore[attr-defined]
        os.close(engine_fd)
        os.close(engine_end)
        caller.work_for(caller.Caller(ours))
        try:
            yield server
        finally:
            process.start_programs_through(None)  # this test process starts its own programs again
            messages.send(ours, ("exit", 0))
    assert server.wait(timeout=10) == 0


def test_run_in_a_worker_captures_what_the_callers_child_writes(served) -> None:
    finished = process.run(["sh", "-c", 'echo "$PPID $MARK"; echo said >&2; cat'], input_text="fed\n",
                           env={"PATH": os.environ["PATH"], "MARK": "given"})
    assert (finished.returncode, finished.stdout, finished.stderr) == (0, f"{served.pid} given\nfed\n", "said\n")
    assert process.run(["sh", "-c", "cat; echo $PPID"]).stdout == f"{served.pid}\n"  # stdin: /dev/null
    ignored = process.run(["sh", "-c", "grep ^SigIgn: /proc/$$/status"]).stdout.split()[1]
    assert not int(ignored, 16) & PYTHONS_IGNORED  # as subprocess starts a program, not as the caller has them


def test_run_in_a_worker_reports_a_failure_by_its_last_line(served) -> None:
    with pytest.raises(process.CommandError) as failed:
        process.run(["sh", "-c", "echo first >&2; echo last >&2; exit 4"])
    assert failed.value.returncode == 4 and str(failed.value).endswith(": last")
    assert process.run(["sh", "-c", "exit 4"], check=False).returncode == 4


def test_run_in_a_worker_kills_a_program_that_does_not_answer_in_time(served) -> None:
    started = time.monotonic()
    with pytest.raises(process.CommandError, match=r"^sleep 30: no answer within 0.3 s$"):
        process.run(["sleep", "30"], timeout_s=0.3)
    assert time.monotonic() - started < 5
    assert children_of(served.pid) == []  # killed, and reaped by the caller


def test_run_in_a_worker_of_a_missing_program_is_127_not_found(served) -> None:
    with pytest.raises(process.CommandError, match="^no-such-program: not found") as missing:
        process.run(["no-such-program", "x"])
    assert missing.value.returncode == 127


def test_spawn_in_a_worker_is_the_callers_child_and_takes_our_signals(served) -> None:
    child = process.spawn(["sleep", "30"])
    assert children_of(served.pid) == [child.pid] and child.poll() is None
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=5) == -signal.SIGTERM and child.poll() == -signal.SIGTERM


def test_a_delegate_in_a_worker_past_its_deadline_ends_with_what_it_started(served, tmp_path: Path) -> None:
    """A dump whose peer never comes, worked in the resident helper: the delegate is the caller's child, and what
    it started (criu, here a sleep) is killed with it (shim/delegate.py)."""
    from gpuckpt.host.procfs import live_start_time
    from gpuckpt.shim.delegate import DelegateRun

    pid_file = tmp_path / "criu.pid"
    script = tmp_path / "runc"
    script.write_text(f"#!/bin/sh\nsleep 1000 &\necho $! > {pid_file}.tmp\nmv {pid_file}.tmp {pid_file}\nwait\n")
    script.chmod(0o755)
    run = DelegateRun(str(script), [])
    run.start()
    assert children_of(served.pid) == [run.pid]
    while not pid_file.exists():
        time.sleep(0.01)
    started_by_it = int(pid_file.read_text())
    began = live_start_time(started_by_it)
    assert run.finish(timeout_s=0.3) == 128 + signal.SIGKILL and run.timed_out
    assert live_start_time(started_by_it) != began and children_of(served.pid) == []


def test_run_in_a_worker_keeps_the_callers_fds_out_and_spawn_passes_them_on(served) -> None:
    """As subprocess.run and process.spawn in our own process: a delegate gets the engine's fds, a query none."""
    listing = "ls /proc/$$/fd"
    assert process.run(["sh", "-c", listing]).stdout.split() == ["0", "1", "2"]
    child = process.spawn(["sh", "-c", f"{listing} >&2"], pipe_stderr=True)
    assert child.stderr is not None and str(served.engine_fd) in child.stderr.read().decode().split()
    assert child.wait(timeout=5) == 0


def test_a_program_gets_the_bytes_of_a_worker_string_that_was_not_utf8(served) -> None:
    """A name that was not UTF-8 (os.fsdecode's escapes: read from a directory, an image, a spec) reaches the program
    as its own bytes, as os.posix_spawn gives them; another surrogate is no program's argument."""
    raw = os.fsdecode(b"a\xffb")
    finished = process.run(["sh", "-c", 'printf %s "$1" | od -An -tx1; printf %s "$V" | od -An -tx1', "sh", raw],
                           env={"PATH": os.environ["PATH"], "V": raw})
    assert finished.stdout.split() == ["61", "ff", "62"] * 2
    with pytest.raises(process.CommandError):
        process.run(["sh", "-c", "exit 0", "sh", "a\ud800b"])


def test_a_program_the_compiled_caller_cannot_watch_does_not_run_on(c_server) -> None:
    """Started, then its pidfd not to be had (the caller's fd limit reached): the worker is told the start failed, so
    the program must not go on unwatched and unreaped (a delegate working while the verb says it never ran)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server_end = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD, 100)  # past the limit: fd 3 for the program's stdout
    read_end, write_end = os.pipe()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with ours, theirs:
        server = subprocess.Popen([str(c_server), str(server_end)], pass_fds=[server_end],
                                  preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (4, hard)))
        os.close(server_end)
        try:
            child = caller.Caller(ours).spawn(["sh", "-c", "sleep 0.5; echo ran on"], stdout=write_end)
        except OSError as error:
            os.close(write_end)
            assert error.errno == errno.EMFILE
            assert os.read(read_end, 100) == b""  # ended at once
        else:  # a caller whose pidfd took no fd more than Python's: watched, as it should be
            os.close(write_end)
            assert child.wait(timeout=5) == 0 and os.read(read_end, 100) == b"ran on\n"
        finally:
            os.close(read_end)
            messages.send(ours, ("exit", 0))
    assert server.wait(timeout=10) == 0


# receive_message() given a message slot that holds what an earlier call left on the stack (an earlier message)
STALE_SLOT = """#include "RESIDENT_CALL"
int main(int argc, char **argv)
{
    unsigned char *buffer = malloc(MAX_MESSAGE);
    struct value stale = {.kind = SEQUENCE, .length = 1, .items = (struct value *)16};
    int fds[MAX_FDS], count;
    (void)argc;
    return receive_message(atoi(argv[1]), buffer, &stale, fds, &count) ? 3 : 0;
}
"""


def test_the_compiled_caller_reads_a_peers_end_without_the_message_it_holds(tmp_path: Path) -> None:
    """At the worker's or the helper's end (recvmsg's 0) nothing was parsed: in call_resident and serve the message
    is an uninitialised variable, freed as a message if its bytes happened to say so."""
    needs_cc()
    source = tmp_path / "stale.c"
    source.write_text(STALE_SLOT.replace("RESIDENT_CALL", str(REPO / "shim" / "resident" / "resident_call.c")))
    subprocess.run(["cc", "-O1", "-std=c11", "-o", str(tmp_path / "stale"), str(source)], check=True)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        ours.close()  # the peer gone before a word
        ended = subprocess.run([str(tmp_path / "stale"), str(theirs.fileno())], pass_fds=[theirs.fileno()], timeout=10)
    assert ended.returncode == 0  # not a crash freeing what it never read
