#!/usr/bin/env python3
"""A podman stand-in for unit tests of the group verbs and gpuckptd's groups: `ps`, `inspect` (the formats they
ask), `container checkpoint|restore`, `kill`, `wait`, `rm`, driven by podman.json next to it and doing to the
suspension records what the shim does.

podman.json: {"containers": {name: {"id", "pid", "status", "labels", "cuda"}},
"fail": {verb: [names]}}. Every call is appended to calls.log as JSON; a checkpoint also logs which CUDA
containers were suspended (had a record in $GPUCKPT_STATE_DIR) at that moment, and a restore whether a
standby request waited for it. A checkpoint of a CUDA container without a record fails, as the shim's lock of
one rank alone would hang: the stand-in says so instead.
"""

import json
import os
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
setup_path = here / "podman.json"
setup = json.loads(setup_path.read_text())
containers = setup["containers"]
argv = sys.argv[1:]
state_dir = Path(os.environ["GPUCKPT_STATE_DIR"])


def log(entry: dict) -> None:
    with open(here / "calls.log", "a") as calls:
        calls.write(json.dumps(entry) + "\n")


def find(name: str) -> tuple[str, dict]:
    for shown, container in containers.items():
        if name == shown or (len(name) >= 12 and container["id"].startswith(name)):
            return shown, container
    print(f"Error: no container with name or ID \"{name}\" found: no such container", file=sys.stderr)
    sys.exit(125)


def save() -> None:
    setup_path.write_text(json.dumps(setup))


def record(container: dict) -> Path:
    return state_dir / "suspended" / f"{container['id']}.json"


log({"argv": argv})
if argv[0] == "ps" and "--filter" not in argv:  # gpuckptd's status: every container's full ID and name
    assert argv[1:] == ["--all", "--no-trunc", "--format", "{{.ID}} {{.Names}}"], argv
    for shown, container in containers.items():
        print(f"{container['id']} {shown}")
elif argv[0] == "ps":
    wanted = argv[argv.index("--filter") + 1].removeprefix("label=")
    key, value = wanted.split("=", 1)
    for container in containers.values():
        if container["labels"].get(key) == value:
            print(container["id"][:12])
elif argv[0] == "inspect":
    shown, container = find(argv[-1])
    asked = argv[argv.index("--format") + 1]
    if "Config.Labels" in asked:  # gpuckptd's question: the group label
        print(next(iter(container["labels"].values()), "<no value>"))
    elif asked == "{{.Id}} {{.StaticDir}}":
        print(f"{container['id']} {here / 'storage' / container['id']}")
    elif asked == "{{.StaticDir}}":
        print(here / "storage" / container["id"])
    elif asked == "{{.State.Running}}":
        print(str(container["status"] == "running").lower())
    elif asked == "{{.Name}}":
        print(shown)
    elif asked == "{{.Id}}":
        print(container["id"])
    else:
        print(f"{shown}\t{container['id']}\t{container['pid']}\t{container['status']}\t"
              f"{container.get('network_mode', 'bridge')}")
elif argv[0] == "container" and argv[1] in ("checkpoint", "restore"):
    verb, name = argv[1], argv[-1]
    shown, container = find(name)
    if verb == "checkpoint":
        suspended = sorted(other for other, each in containers.items() if each["cuda"] and record(each).exists())
        log({"checkpoint": shown, "suspended": suspended})
        if shown in setup.get("fail", {}).get(verb, []) or (container["cuda"] and not record(container).exists()):
            print(f"Error: checkpoint of {shown} refused by the stand-in", file=sys.stderr)
            sys.exit(125)
        kept = here / "storage" / container["id"] / "checkpoint"  # podman's checkpoint directory of it
        kept.mkdir(parents=True, exist_ok=True)
        (kept / "inventory.img").write_bytes(b"")
        if "--leave-running" not in argv:
            container.update(status="exited")
            record(container).unlink(missing_ok=True)  # the shim: the dump ended the processes
    else:
        request = state_dir / "standby-requests" / container["id"]
        log({"restore": shown, "standby_requested": request.exists()})
        if shown in setup.get("fail", {}).get(verb, []):
            print(f"Error: restore of {shown} refused by the stand-in", file=sys.stderr)
            sys.exit(125)
        if request.exists():
            request.unlink()  # the shim takes it; its processes stay checkpointed (the test's driver keeps them so)
            if container["cuda"]:  # and records the standby, as the shim's restore does for CUDA processes
                record(container).parent.mkdir(parents=True, exist_ok=True)
                record(container).write_text(json.dumps({"container": container["id"], "engine": "standby",
                                                         "init_pid": container["pid"], "since": "now",
                                                         "processes": []}))
        container.update(status="running")
    save()
elif argv[0] == "rm":  # gpuckptd's restore of an archive removes the exited container first
    find(argv[-1])
elif argv[0] in ("kill", "wait"):
    shown, container = find(argv[-1])
    container.update(status="exited")
    save()
else:
    print(f"Error: the stand-in has no {argv[:2]}", file=sys.stderr)
    sys.exit(125)
