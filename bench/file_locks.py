"""podman's --file-locks checkpoint/restore, N times through gpuckpt-runtime and N times through runc,
in the same run: the failures of each, side by side (issue #19: one failure in eight runs was seen
with podman 5.8 in the forky root, CRIU "Unseizable non-zombie ... state D").

Usage (root, on a set-up node or inside integration/testbed/in-forky.sh):
    python3 bench/file_locks.py [N] [OUT.json]
Each cycle checkpoints a container that holds a POSIX lock (`--file-locks`), restores it and checks
that the same workload goes on holding its lock; a failed cycle is recorded with the error's tail
and the container is made anew.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time

IMAGE = "localhost/gpuckpt-test:latest"
WORKLOAD = (
    "import fcntl, os, time\n"
    "held = open('/tmp/locked', 'w'); fcntl.lockf(held, fcntl.LOCK_EX)\n"
    "token, count = os.urandom(4).hex(), 0\n"
    "while True:\n"
    "    count += 1\n"
    "    open('/tmp/state.new', 'w').write(f'{token} {count}\\n'); os.replace('/tmp/state.new', '/tmp/state')\n"
    "    time.sleep(0.1)\n"
)


def podman(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PODMAN_IGNORE_CGROUPSV1_WARNING": "1"})
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(argv[:3])} exited {result.returncode}: {result.stderr.strip()[-300:]}")
    return result


def state(name: str) -> tuple[str, int]:
    token, count = podman("exec", name, "cat", "/tmp/state").stdout.split()
    return token, int(count)


def wait_state(name: str, above: int = 0) -> tuple[str, int]:
    deadline = time.monotonic() + 30
    while True:
        try:
            token, count = state(name)
            if count > above:
                return token, count
        except (RuntimeError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: workload state did not advance past {above}")
        time.sleep(0.1)


def start(name: str, runtime: str) -> None:
    podman("rm", "-f", "-t", "0", name, check=False)
    podman("run", "-d", "--runtime", runtime, "--name", name, "--network", "none", IMAGE, "python3", "-c", WORKLOAD)
    wait_state(name)


def cycle(name: str) -> None:
    token, count = wait_state(name)
    podman("container", "checkpoint", "--file-locks", name)
    podman("container", "restore", "--file-locks", name)
    after_token, after = wait_state(name, count)
    if after_token != token:
        raise RuntimeError(f"{name}: restarted instead of restored ({token} -> {after_token})")
    locks = podman("exec", name, "cat", "/proc/locks").stdout
    if "POSIX" not in locks:
        raise RuntimeError(f"{name}: the restored workload holds no POSIX lock: {locks!r}")


def run(runtime: str, cycles: int) -> dict:
    name = f"gpuckpt-bench-locks-{runtime.replace('/', '_')}-{os.getpid()}"
    failures: list[str] = []
    started = time.monotonic()
    start(name, runtime)
    for number in range(cycles):
        try:
            cycle(name)
        except RuntimeError as error:
            failures.append(f"cycle {number}: {error}")
            start(name, runtime)
    podman("rm", "-f", "-t", "0", name, check=False)
    return {"runtime": runtime, "cycles": cycles, "failures": len(failures), "errors": failures,
            "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    results = {"machine": platform.node(), "podman": podman("--version").stdout.strip(),
               "criu": subprocess.run(["criu", "--version"], capture_output=True, text=True).stdout.split("\n")[0],
               # runc by its path: under `gpuckpt install --engine podman --default` podman's "runc" is the shim
               "runs": [run(runtime, cycles) for runtime in ("gpuckpt-runtime", shutil.which("runc") or "runc")]}
    for entry in results["runs"]:
        print(f"{entry['runtime']:>16}: {entry['failures']} of {entry['cycles']} cycles failed ({entry['seconds']} s)")
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
