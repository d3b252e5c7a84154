"""What podman writes about the node into a checkpoint image it makes (`--create-image`), asked
of this node the same way, so an image gpuckpt writes carries the same keys: the cgroup version,
the distribution, and the versions of podman, conmon, CRIU and the container's runtime.

podman 4.3's values, seen: cgroups.version "v1", conmon.version "conmon version 2.1.6, commit:
unknown", criu.version "40201", distribution.name "debian", distribution.version "12",
podman.version "4.3.1", runtime.version the runtime's whole `--version` output. A program
that is missing or does not answer gives "" (podman's own value for what it cannot learn).
"""

from __future__ import annotations

import re

from .cgroup_v1 import hybrid_or_legacy
from .process import CommandError, run
from .programs import find_program

OS_RELEASE = "/etc/os-release"
KEY = "io.podman.annotations.checkpoint"
# The runtimes whose `--version` is asked: the name comes from the checkpoint's config.dump, which is
# data, never a program to run unless it names one of these (looked up on PATH)
KNOWN_RUNTIMES = frozenset({"gpuckpt-runtime", "runc", "crun"})
# buildah's annotations of an image's base; podman's checkpoint images have no base: both empty
BASE_ANNOTATIONS = {"org.opencontainers.image.base.digest": "", "org.opencontainers.image.base.name": ""}


def _output(program: str, *argv: str) -> str:
    path = find_program(program)
    if path is None:
        return ""
    try:
        return run([path, *argv], timeout_s=10).stdout.strip()
    except CommandError:
        return ""


def _os_release() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        with open(OS_RELEASE) as release:
            for line in release:
                name, _, value = line.strip().partition("=")
                fields[name] = value.strip('"')
    except OSError:
        pass
    return fields


def _criu_version() -> str:
    """CRIU's version as podman gives it: 4.2.1 -> "40201"."""
    found = re.search(r"Version: (\d+)\.(\d+)(?:\.(\d+))?", _output("criu", "--version"))
    if found is None:
        return ""
    major, minor, sub = (int(part or 0) for part in found.groups())
    return str(major * 10000 + minor * 100 + sub)


def checkpoint_host_annotations(runtime: str) -> dict[str, str]:
    """podman's node annotations of a checkpoint image, for a container run by `runtime` (its name)."""
    release = _os_release()
    podman = _output("podman", "--version").rpartition(" ")[2]
    return {
        f"{KEY}.cgroups.version": "v1" if hybrid_or_legacy() else "v2",
        f"{KEY}.conmon.version": ", ".join(_output("conmon", "--version").splitlines()),
        f"{KEY}.criu.version": _criu_version(),
        f"{KEY}.distribution.name": release.get("ID", ""),
        f"{KEY}.distribution.version": release.get("VERSION_ID", ""),
        f"{KEY}.podman.version": podman,
        f"{KEY}.runtime.version": _output(runtime, "--version") if runtime in KNOWN_RUNTIMES else "",
        **BASE_ANNOTATIONS,
    }
