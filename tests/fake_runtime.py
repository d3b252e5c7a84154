#!/usr/bin/env python3
"""A runc stand-in for unit tests of the owned verbs: `state`, `ps`, `checkpoint`, `restore`, `kill`, `delete`.

Driven by a JSON file next to it (runtime.json): the container's state, its PIDs and
the exit status each verb should return. Every call is appended to calls.log.
"""

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

here = Path(__file__).resolve().parent
setup = json.loads((here / "runtime.json").read_text())
argv = sys.argv[1:]
with open(here / "calls.log", "a") as calls:
    calls.write(json.dumps(argv) + "\n")
words = [arg for arg in argv if not arg.startswith("-")]
verb = next((word for word in words if word in ("state", "ps", "checkpoint", "restore", "kill", "delete",
                                                  "pause", "resume")), None)
if verb == "state":
    print(json.dumps(setup["state"]))
elif verb == "ps":
    print(json.dumps(setup["pids"]))
elif verb == "checkpoint":
    if "checkpoint_statuses" in setup:  # one status per call, in order (the last one from then on)
        made = sum('"checkpoint"' in line and '"--image-path"' in line  # dumps, not `checkpoint --help`
                   for line in (here / "calls.log").read_text().splitlines())
        setup["checkpoint_status"] = setup["checkpoint_statuses"][min(made, len(setup["checkpoint_statuses"])) - 1]
    if "--image-path" in argv and setup.get("checkpoint_status", 0) == 0:
        image_path = argv[argv.index("--image-path") + 1]
        os.makedirs(image_path, exist_ok=True)
        with open(os.path.join(image_path, "fake-dump.img"), "w") as dumped:  # what CRIU would write there
            dumped.write(str(os.getpid()))
    if "checkpoint_signals_caller" in setup:  # the engine signals the runtime while the dump runs
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # runc's dump completes all the same
        os.kill(os.getppid(), getattr(signal, setup["checkpoint_signals_caller"]))
        time.sleep(0.2)  # the forwarded signal arrives before the dump ends
    if "checkpoint_fills_disk_bytes" in setup:  # the dump fills the disk: the caller's writes fail after it
        limit = setup["checkpoint_fills_disk_bytes"]
        resource.prlimit(os.getppid(), resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    if "--image-path" in argv and setup.get("checkpoint_status", 0) != 0 and "checkpoint_failure_leaves" in setup:
        image_path = argv[argv.index("--image-path") + 1]  # what a dump failing half-way leaves behind
        os.makedirs(image_path, exist_ok=True)
        Path(image_path, setup["checkpoint_failure_leaves"]).write_text(os.environ.get("CRIU_CONFIG_FILE", ""))
    if "--image-path" in argv and "checkpoint_records_criu_config" in setup:  # the config file this dump was given
        with open(here / "criu_configs.log", "a") as seen:
            seen.write(os.environ.get("CRIU_CONFIG_FILE", "-") + "\n")
    if "--lazy-pages" in argv and "--status-fd" in argv:  # runc's handshake: \0 once the page server is ready
        status_fd = int(argv[argv.index("--status-fd") + 1])
        with open(here / "status_fd.log", "w") as seen:  # the descriptor it got and where that leads
            seen.write(f"{status_fd} {os.readlink(f'/proc/self/fd/{status_fd}')}\n")
        ready = setup.get("lazy_ready", True)  # false: CRIU failed before its page server was ready
        if ready:
            os.write(status_fd, b"\0")
        os.close(status_fd)
        deadline = time.monotonic() + 20
        while ready and not (here / "lazy.taken").exists() and time.monotonic() < deadline:  # the pages taken
            time.sleep(0.02)
    sys.stderr.write(setup.get("checkpoint_stderr", ""))
    if "checkpoint_leaves_helper_s" in setup and os.fork() == 0:  # a helper left running, holding stderr
        (here / "helper.pid").write_text(str(os.getpid()))
        time.sleep(setup["checkpoint_leaves_helper_s"])
        (here / "helper.done").write_text("")
        os._exit(0)
    sys.exit(setup.get("checkpoint_status", 0))
elif verb == "restore":
    if "--lazy-pages" in argv:  # the manifest as the lazy restore found it
        image_path = argv[argv.index("--image-path") + 1]
        (here / "lazy_restore_saw.json").write_text(Path(image_path, "gpuckpt-manifest.json").read_text())
    if "restore_log" in setup:  # CRIU's restore.log, where runc leaves it: the work path, else the images
        work = argv[argv.index("--work-path") + 1] if "--work-path" in argv else argv[argv.index("--image-path") + 1]
        Path(work, "restore.log").write_text(setup["restore_log"])
    sys.exit(setup.get("restore_status", 0))
elif verb in ("pause", "resume"):
    sys.exit(setup.get(f"{verb}_status", 0))
sys.exit(0)
