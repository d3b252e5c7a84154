"""The compiled launcher (shim/resident/: launcher.c, resident_call.c) and the Python shim held to one contract:
its tables and constants are generated from the Python ones (shim/resident/contract.py), it routes each command line
as shim/argv.py's parse says, and it sends the resident helper the same bytes as shim/resident/call.py."""

from __future__ import annotations

import marshal
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import REPO, build_launcher, python_calls, write_config

import gpuckpt
from gpuckpt.shim.argv import (
    ASKING_FLAGS,
    OWNED_VERBS,
    owned_verb_is_only_asked_about,
    parse_runtime_args,
    parse_verb_args,
)
from gpuckpt.shim.resident import call as resident_call
from gpuckpt.shim.resident import contract, messages

SITE = os.path.dirname(os.path.dirname(os.path.abspath(gpuckpt.__file__)))
GENERATOR = REPO / "shim" / "resident" / "contract.py"
COMMITTED_HEADER = REPO / "shim" / "resident" / contract.HEADER_NAME
EXIT_STATUS = 7  # the recording helper's worker says the verb ended so
# The launcher's -c code, with the installed gpuckpt: the shim sees the launcher's path as its argv[0]
PYTHON_SHIM = "import sys\nsys.argv[:2] = sys.argv[1:2]\nfrom gpuckpt.shim.main import main\nsys.exit(main())\n"
# Runs argv[2:] with exactly the environment entries in file argv[1] (NUL-ended bytes; execve takes a name twice, a
# nameless entry, one without "=", which a dict cannot give)
EXEC_WITH_ENTRIES = """import ctypes, os, sys
def strings(values):
    return (ctypes.c_char_p * (len(values) + 1))(*values, None)
with open(sys.argv[1], "rb") as listing:
    entries = listing.read().split(b"\\0")[:-1]
argv = [os.fsencode(arg) for arg in sys.argv[2:]]
ctypes.CDLL(None, use_errno=True).execve(argv[0], strings(argv), strings(entries))
sys.exit(f"execve: {os.strerror(ctypes.get_errno())}")
"""

needs_cc = pytest.mark.skipif(shutil.which("cc") is None or not Path("/usr/include/zlib.h").exists(),
                              reason="no cc or zlib.h: run integration/testbed/install-system.sh (gcc, zlib1g-dev)")


def test_the_committed_header_is_what_the_python_definitions_give() -> None:
    """shim/resident/build.sh writes the header afresh for each build; the committed copy is what tests/c and
    test_resident.py compile resident_call.c against, so it must not lag the Python side."""
    checked = subprocess.run([sys.executable, "-I", "-B", str(GENERATOR), "--check", str(COMMITTED_HEADER)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr


def test_a_header_that_lags_the_python_definitions_is_caught(tmp_path: Path) -> None:
    stale = tmp_path / contract.HEADER_NAME
    stale.write_text(COMMITTED_HEADER.read_text().replace('"runtime.sock"', '"old.sock"'))
    checked = subprocess.run([sys.executable, "-I", "-B", str(GENERATOR), "--check", str(stale)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 1 and "is not what the Python definitions give" in checked.stderr


def test_the_generator_reads_the_source_tree_and_writes_no_bytecode_there(tmp_path: Path) -> None:
    """As packaging/stage.sh runs it: a python3 that has no gpuckpt installed, on a tree named anything."""
    tree = tmp_path / "src-any-name"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", "tests",
                                                              "integration", "bench", "packaging"))
    (tree / "shim" / "argv.py").write_text((tree / "shim" / "argv.py").read_text().replace(
        '"log-level"}', '"log-level", "extra-global"}'))
    written = subprocess.run([sys.executable, "-I", "-B", str(tree / "shim" / "resident" / "contract.py"), "-"],
                             capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert written.returncode == 0, written.stderr
    assert '"extra-global"' in written.stdout  # this tree's table, not the installed one's
    assert not list(tree.rglob("__pycache__"))


def test_a_name_the_c_side_cannot_hold_as_written_is_refused() -> None:
    modules = {name: SimpleNamespace(**vars(module)) for name, module in contract._source_modules().items()}
    modules["argv"].GLOBAL_VALUE_FLAGS = frozenset({'ro"ot'})
    with pytest.raises(SystemExit, match=r"""'ro"ot' is not a name the C side can hold as written"""):
        contract.render(modules)


class RecordingHelper:
    """A listener on the helper's socket, in this process (root with all our powers, as a caller demands), that
    records each call (its bytes, and the identity of each fd it carried) and answers as a worker whose verb
    ended with EXIT_STATUS."""

    def __init__(self, path: Path) -> None:
        self.calls: list[tuple[bytes, list[tuple[int, int]]]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(path))
        self.listener.listen(16)
        self.listener.settimeout(0.1)
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping:
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(10)
                data, ancillary, _, _ = connection.recvmsg(messages.MAX_MESSAGE,
                                                           socket.CMSG_SPACE(messages.FD_BYTES * messages.MAX_FDS))
                fds = messages.unpack_fds(ancillary)
                identities = [(status.st_dev, status.st_ino) for status in map(os.fstat, fds)]
                for fd in fds:
                    os.close(fd)
                if not data:
                    continue  # a probe of whether we listen
                self.calls.append((data, identities))
                messages.send(connection, ("worker", os.getpid()))
                messages.send(connection, ("exit", EXIT_STATUS))

    def take(self) -> list[tuple[bytes, list[tuple[int, int]]]]:
        calls, self.calls = self.calls, []
        return calls

    def stop(self) -> None:
        self.stopping = True
        self.thread.join()
        self.listener.close()


@pytest.fixture(scope="module")
def launcher_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("cc") is None or not Path("/usr/include/zlib.h").exists():
        pytest.skip("no cc or zlib.h: run integration/testbed/install-system.sh (gcc, zlib1g-dev)")
    return build_launcher(tmp_path_factory.mktemp("launcher"), SITE)


def base_entries(node: Path) -> list[bytes]:
    # A locale of its own: in the C locale Python sets LC_CTYPE=C.UTF-8 in its environment first (PEP 538), and
    # the Python caller sends that too; the compiled one sends what the engine gave
    return [f"PATH={os.environ['PATH']}".encode(), f"GPUCKPT_CONFIG={node / 'config.toml'}".encode(),
            f"GPUCKPT_STATE_DIR={node / 'state'}".encode(), f"GPUCKPT_JOURNAL_DIR={node / 'journal'}".encode(),
            b"LANG=C.UTF-8"]


class Callers:
    """The compiled launcher and the Python shim, each started with exactly the given environment entries in one
    working directory and with the same stdio files, and what each sent the recording helper."""

    def __init__(self, node: Path, launcher: Path, calls_file: Path, helper: RecordingHelper) -> None:
        self.node, self.launcher, self.calls_file, self.helper = node, launcher, calls_file, helper

    def run(self, command: list[str], argv: Sequence[str | bytes], entries: list[bytes]) -> int:
        listing = self.node / "entries"
        listing.write_bytes(b"".join(entry + b"\0" for entry in entries))
        with open(self.node / "out", "ab") as out, open(self.node / "err", "ab") as err:
            return subprocess.run([sys.executable, "-I", "-c", EXEC_WITH_ENTRIES, str(listing), *command, *argv],
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=self.node / "cwd",
                                  timeout=60).returncode

    def compiled(self, argv: Sequence[str | bytes], entries: list[bytes]) -> int:
        return self.run([str(self.launcher)], argv, entries)

    def python(self, argv: Sequence[str | bytes], entries: list[bytes]) -> int:
        return self.run([sys.executable, "-I", "-c", PYTHON_SHIM, str(self.launcher)], argv, entries)

    def python_starts(self) -> int:
        return python_calls(self.calls_file)


@pytest.fixture
def callers(launcher_build, node: Path, recording_runtime: Path) -> Iterator[Callers]:
    """A config naming the recording runtime (bin/runc), the launcher's delegate cache written, c1's lock file
    (without one a runc delete is passed through), and the recording helper listening."""
    built, calls_file = launcher_build
    write_config(node, f'delegate = "{recording_runtime}"\n')
    (node / "cwd").mkdir()
    (node / "state" / "locks").mkdir(mode=0o700, parents=True)
    (node / "state" / "locks" / "c1.lock").touch()
    helper = RecordingHelper(node / "state" / resident_call.SOCKET_NAME)
    ready = Callers(node, built.resolve(), calls_file, helper)
    try:
        assert ready.compiled(["state", "warm"], base_entries(node)) == 0, (node / "err").read_text()
        yield ready
    finally:
        helper.stop()


def expected_route(argv: list[str], node: Path, delegate: Path) -> str:
    """Where the launcher must send a command line, from shim/argv.py's parse: to the resident helper what the shim
    works as an owned verb, to the delegate what the shim passes through; to the shim itself what it must judge
    (no verb, a global option the launcher does not know or one that asks for help or the version). A delete with
    runc and no lock file of its container is runc's alone (shim/delete.py adds nothing)."""
    args = parse_runtime_args(argv)
    if args.command is None or args.unknown_global is not None or ASKING_FLAGS & args.globals_.keys():
        return "shim"
    owned = args.command in OWNED_VERBS and not owned_verb_is_only_asked_about(args)
    if args.command == "delete":
        container = parse_verb_args(args.command_args, frozenset()).container_id
        if delegate.name == "runc" and container and "/" not in container and container not in (".", "..") \
                and not (node / "state" / "locks" / f"{container}.lock").exists():
            return "delegate"
        return "resident" if owned else "shim"
    return "resident" if owned else "delegate"


ROUTED = [
    [], ["state", "c1"], ["-", "state"], ["--root", "/r", "kill", "c1", "KILL"], ["--root=/r", "--log", "--debug",
                                                                                 "state", "c1"],
    ["create", "--bundle", "/b", "c1"], ["--root"], ["--", "state"], ["--no-such", "state"],
    ["--version"], ["-v", "state"], ["--help", "state", "c1"], ["--help=false", "pause", "c1"],
    ["checkpoint", "c1"], ["checkpoint", "--image-path", "/x", "c1"], ["checkpoint", "--help"],
    ["checkpoint", "--help", "c1"], ["checkpoint", "c1", "--help"], ["checkpoint", "--help=false", "c1"],
    ["checkpoint", "-h=0", "c1"], ["checkpoint", "--image-path", "--help", "c1"], ["checkpoint", "--image-path"],
    ["checkpoint", "--work-path", "--", "c1"], ["checkpoint", "--", "--help"], ["checkpoint", "--leave-running", "c1"],
    ["restore", "-b", "--help", "c1"], ["restore", "--bundle", "/b", "-d", "c1"], ["restore", "-h"],
    ["restore", "--detach", "--help", "c1"], ["restore", "--console-socket=/s", "-h", "c1"],
    ["pause", "c1"], ["pause"], ["pause", "--help", "c1"], ["resume", "c1", "--help"], ["resume", "-h"],
    ["--debug", "--log-format", "json", "pause", "c1"], ["-debug", "-root", "/r", "resume", "c1"],
    ["delete", "c1"], ["delete", "--force", "c1"], ["delete"], ["delete", "--help", "c1"], ["delete", "c2"],
    ["delete", "--help", "c2"],
]


@needs_cc
def test_the_launcher_routes_each_command_line_as_shim_argv_parses_it(callers: Callers, node: Path,
                                                                       recording_runtime: Path) -> None:
    recorded = recording_runtime.parent / "argv"
    routes = {}
    for argv in ROUTED:
        recorded.unlink(missing_ok=True)
        callers.helper.take()
        before = callers.python_starts()
        callers.compiled(argv, base_entries(node))
        if callers.python_starts() != before:
            routes[" ".join(argv)] = "shim"
        elif callers.helper.take():
            routes[" ".join(argv)] = "resident"
        else:
            assert recorded.read_text().splitlines() == argv  # unchanged, to the delegate
            routes[" ".join(argv)] = "delegate"
    assert routes == {" ".join(argv): expected_route(argv, node, recording_runtime) for argv in ROUTED}


MANY = [f"VAR_{index}={'x' * (index % 7)}={index}".encode() for index in range(400)]
CALLS = {
    "globals before the verb": (["--root", "/run/r", "--log=/l", "--debug", "checkpoint", "--image-path", "/i", "c1"],
                                []),
    "values that look like flags": (["restore", "--image-path", "--help", "--bundle=/b", "-d", "--work-path", "",
                                     "c1"], []),
    "a delete with its lock file": (["--log-format", "json", "delete", "--force", "c1"], []),
    "a container after --": (["pause", "--", "-c1"], []),
    "a --help after the container": (["checkpoint", "c1", "--help"], []),
    "text beyond ASCII": (["resume", "cé-✓"], ["MARK=é✓".encode()]),
    "many variables": (["pause", "c1"], MANY),
    "what os.environ leaves out": (["pause", "c1"], [b"TWICE=first", b"TWICE=second", b"=nameless", b"NO_EQUALS",
                                                     b"EMPTY="]),
}


@needs_cc
@pytest.mark.parametrize("case", CALLS)
def test_the_compiled_and_the_python_caller_send_the_same_call(callers: Callers, node: Path, case: str) -> None:
    argv, extra = CALLS[case]
    entries = base_entries(node) + extra
    assert callers.compiled(argv, entries) == EXIT_STATUS, (node / "err").read_text()
    compiled = callers.helper.take()
    assert callers.python(argv, entries) == EXIT_STATUS, (node / "err").read_text()
    python = callers.helper.take()
    assert len(compiled) == len(python) == 1
    assert marshal.loads(compiled[0][0]) == marshal.loads(python[0][0])  # a readable difference first
    assert compiled[0][0] == python[0][0]  # the marshal'd call, byte for byte
    assert compiled[0][1] == python[0][1]  # its fds: the same stdio files and working directory
    assert len(compiled[0][1]) == messages.MAX_FDS


@needs_cc
@pytest.mark.parametrize(("argv", "extra"), [
    (["delete", b"c\xff1"], []),
    (["delete", "c1"], [b"MARK=\xff"]),
])
def test_bytes_that_are_not_utf8_are_the_shims_to_send(callers: Callers, node: Path, argv: Sequence[str | bytes],
                                                       extra: list[bytes]) -> None:
    """The compiled caller sends only text that is UTF-8 and hands anything else to the Python shim, which works the
    verb itself (resident=False); the Python caller sends such bytes as os.fsdecode's escapes (marshal keeps them)."""
    entries = base_entries(node) + extra
    (node / "state" / "locks" / os.fsdecode(b"c\xff1.lock")).touch()  # as c1's: a delete the shim owns
    before = callers.python_starts()
    callers.compiled(argv, entries)
    assert callers.helper.take() == [] and callers.python_starts() == before + 1
    assert callers.python(argv, entries) == EXIT_STATUS
    [(data, _)] = callers.helper.take()
    message = marshal.loads(data)
    fields = dict(zip(resident_call.CALL_FIELDS, message, strict=True))
    assert [os.fsencode(arg) for arg in fields["argv"]] == [os.fsencode(arg) for arg in argv]
    assert {os.fsencode(name) + b"=" + os.fsencode(value) for name, value in fields["environment"].items()} == \
        set(entries)


# The launcher's -c code as it hands the shim the engine's argv[0] (here a link named after a delegate) before its own
PYTHON_SHIM_CALLED_AS = ("import sys\ncalled_as = sys.argv[1]\nsys.argv[:3] = sys.argv[2:3]\n"
                         "from gpuckpt.shim.main import main\nsys.exit(main(called_as=called_as))\n")


@needs_cc
def test_both_callers_send_the_delegate_the_name_they_were_called_under_chose(callers: Callers, node: Path,
                                                                              tmp_path: Path) -> None:
    """Called as crun (podman's table pointing crun at a link of that name, `gpuckpt install --default`), the
    compiled and the Python caller both choose the crun on PATH over the configured delegate (shim/resolve.py
    delegate_named; the C side's table generated from it) and send the helper the same call."""
    crun = tmp_path / "other-bin" / "crun"
    crun.parent.mkdir()
    shutil.copy(node / "bin" / "runc", crun)
    link = tmp_path / "as" / "crun"
    link.parent.mkdir()
    link.symlink_to(callers.launcher)
    entries = [b"PATH=" + os.fsencode(f"{crun.parent}:{os.environ['PATH']}"), *base_entries(node)[1:]]
    assert callers.run([str(link)], ["state", "warm"], entries) == 0, (node / "err").read_text()  # its cache entry
    before = callers.python_starts()
    assert callers.run([str(link)], ["pause", "c1"], entries) == EXIT_STATUS, (node / "err").read_text()
    assert callers.python_starts() == before  # the compiled caller sent it
    compiled = callers.helper.take()
    assert callers.run([sys.executable, "-I", "-c", PYTHON_SHIM_CALLED_AS, str(link), str(callers.launcher)],
                       ["pause", "c1"], entries) == EXIT_STATUS, (node / "err").read_text()
    python = callers.helper.take()
    assert len(compiled) == len(python) == 1
    fields = dict(zip(resident_call.CALL_FIELDS, marshal.loads(compiled[0][0]), strict=True))
    assert fields["delegate"] == str(crun)
    assert marshal.loads(compiled[0][0]) == marshal.loads(python[0][0])
    assert compiled[0][0] == python[0][0]
