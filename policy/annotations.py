"""What a container may ask of the runtime and CRIU: the operator decides, not the spec.

Checked by both owned verbs before anything runs, on the annotations runc keeps for the
container (its state) and those of the bundle it is restored from. First the annotations
runc acts on, as runc sees them (it turns each into a `key=value` label and looks labels
up by the text before the first `=`); then the io.gpuckpt.* choices a container makes,
which may only tighten the operator's policy.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..errors import GpuckptError

if TYPE_CHECKING:
    from ..node.config import CriuConfig, CudaConfig

CRIU_CONFIG_ANNOTATION = "org.criu.config"
ALLOW_UNRESTORABLE_ANNOTATION = "io.gpuckpt.allow-unrestorable"
RESTORE_MODE_ANNOTATION = "io.gpuckpt.restore"
RESTORE_MODES = ("full", "standby")  # the values the annotation may take
BUNDLE_LABEL = "bundle"
SYSTEMD_PROPERTY_PREFIX = "org.systemd.property."
# runc's own list (`runc features`, potentiallyUnsafeConfigAnnotations): "bundle" (runc keeps
# the bundle path under that label; exec reads its config.json from there), systemd unit
# properties (set on the container's unit at create and restore), and org.criu.config (the
# CRIU config file for dump and restore). Engines set these properties on every container
# (podman: KillSignal, TimeoutStopUSec; CRI-O: CollectMode, DefaultDependencies, After): they
# change how the unit stops, never what it may reach, so they alone pass.
ENGINE_SYSTEMD_PROPERTIES = frozenset({"KillSignal", "TimeoutStopUSec", "TimeoutStopSec", "CollectMode",
                                       "DefaultDependencies", "After"})
# Engines' storage: files there are written by whoever made a container or an archive.
CONTAINER_STORAGE = ("/var/lib/containers", "/run/containers", "/var/lib/docker", "/run/docker",
                     "/var/lib/containerd", "/run/containerd", "/var/lib/kubelet", "/var/lib/crio",
                     "/run/runc", "/run/crun", "/run/gpuckpt")
MAX_PATH_BYTES = 4096
# How permissive each io.gpuckpt.criu.* value is: a container may choose one at most as
# permissive as the operator's.
LOOSENESS = {"never": 0, "auto": 1, "always": 2}


class PolicyError(GpuckptError):
    """A container asked for something the operator has not allowed."""


def refuse_runtime_annotations(annotations: Mapping[str, str], container_id: str, criu: CriuConfig, config_file: str,
                               container_dirs: Iterable[str] = ()) -> None:
    """Refuse every annotation runc would act on, unless it is an org.criu.config the operator
    allows (`criu`: the config's CriuConfig) naming a file that passes `criu_config_file_problem`."""
    for key, value in sorted(annotations.items()):
        name = key.partition("=")[0]
        said = f"container {container_id} carries the annotation {key}={value!r}"
        if name not in (CRIU_CONFIG_ANNOTATION, BUNDLE_LABEL) and not name.startswith(SYSTEMD_PROPERTY_PREFIX):
            continue
        if key != name:
            raise PolicyError(f"{said}: runc splits labels at the first '=' and would act on it as {name}; "
                              f"a key that starts with {name}= is refused")
        if name == BUNDLE_LABEL:
            raise PolicyError(f"{said}: runc keeps the bundle's path under that label and would take the "
                              "container's; refused")
        if name.startswith(SYSTEMD_PROPERTY_PREFIX):
            if name.removeprefix(SYSTEMD_PROPERTY_PREFIX) in ENGINE_SYSTEMD_PROPERTIES:
                continue
            raise PolicyError(f"{said}: runc would set it on the container's systemd unit; refused (allowed: "
                              f"{', '.join(SYSTEMD_PROPERTY_PREFIX + p for p in sorted(ENGINE_SYSTEMD_PROPERTIES))})")
        if not criu.allow_container_config:
            raise PolicyError(f"{said}: a CRIU configuration chosen by the container is refused; the operator "
                              f"may allow it with criu.allow_container_config = true in {config_file}")
        problem = criu_config_file_problem(value, criu.container_config_dirs, [*CONTAINER_STORAGE, *container_dirs])
        if problem:
            raise PolicyError(f"{said}: {problem}; allowed: a regular file owned by root and writable by root only, "
                              f"in {', '.join(criu.container_config_dirs)} (criu.container_config_dirs in "
                              f"{config_file}), outside container storage")


def _under(path: str, directory: str) -> bool:
    directory = directory.rstrip("/")
    return path == directory or path.startswith(directory + "/")


def criu_config_file_problem(path: str, allowed_dirs: Iterable[str], storage: Iterable[str]) -> str | None:
    """Why CRIU must not read `path` as a config file chosen by a container, or None.

    CRIU opens the path itself later, so the path must resolve to the same file until then:
    it is walked from / one component at a time without following links, every directory
    owned by root and writable by root only or sticky (others may add entries there, never
    rename or remove root's), and the file checked through the descriptor that opened it.
    """
    if not path:
        return "it names no file (runc would then leave out the operator's /etc/criu/runc.conf)"
    if "\0" in path or len(path.encode()) > MAX_PATH_BYTES or not path.startswith("/") \
            or os.path.normpath(path) != path:
        return "not an absolute, normalised path"
    if not any(_under(path, directory) and path != directory for directory in allowed_dirs):
        return "not in a directory the operator lists"
    if any(_under(path, directory) for directory in storage if directory):
        return "inside container storage"
    return _walked_file_problem(path)


def _walked_file_problem(path: str) -> str | None:
    """criu_config_file_problem's walk of an absolute, normalised `path`: each directory, then the file."""
    parts = path.strip("/").split("/")
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        walked = "/"
        for part in parts[:-1]:
            problem = _owner_problem(os.fstat(fd), walked, directory=True)
            if problem:
                return problem
            try:
                next_fd = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as error:
                return f"{os.path.join(walked, part)}: {error.strerror} (links are not followed)"
            os.close(fd)
            fd, walked = next_fd, os.path.join(walked, part)
        problem = _owner_problem(os.fstat(fd), walked, directory=True)
        if problem:
            return problem
        try:
            file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as error:
            return f"{error.strerror} (links are not followed)"
        try:
            found = os.fstat(file_fd)
        finally:
            os.close(file_fd)
        if not stat.S_ISREG(found.st_mode):
            return "not a regular file"
        return _owner_problem(found, path, directory=False)
    finally:
        os.close(fd)


def _owner_problem(found: os.stat_result, path: str, directory: bool) -> str | None:
    if found.st_uid != 0:
        return f"{path} is owned by uid {found.st_uid}, not root"
    if found.st_mode & 0o022 and not (directory and found.st_mode & stat.S_ISVTX):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(found.st_mode):04o})"
    return None


def tightened(operator: str, annotation: str, value: str, container_id: str) -> str:
    """A container's value for an option policy when it is at most as permissive as the operator's.

    A loosening annotation is refused rather than ignored: a checkpoint made with other options
    than the container asked for would surprise its owner at restore, and the refusal says what
    to change before anything is touched.
    """
    if LOOSENESS.get(value, 0) > LOOSENESS.get(operator, 0):
        raise PolicyError(f"container {container_id} carries the annotation {annotation}={value!r}, looser than "
                          f"the operator's {operator!r}: a container may only tighten the operator's policy "
                          f"(allowed here: {', '.join(v for v, n in LOOSENESS.items() if n <= LOOSENESS[operator])})")
    return value


def unrestorable_allowed(cuda: CudaConfig, annotations: Mapping[str, str], container_id: str) -> bool:
    """Whether processes the driver cannot restore may be checkpointed (`cuda`: the CudaConfig)."""
    asked = annotations.get(ALLOW_UNRESTORABLE_ANNOTATION) == "true"
    if cuda.allow_unrestorable == "never" and asked:
        raise PolicyError(f"container {container_id} carries the annotation {ALLOW_UNRESTORABLE_ANNOTATION}=true; "
                          "the operator's cuda.allow_unrestorable = \"never\" refuses it")
    return cuda.allow_unrestorable is True or asked


def standby_asked(cuda: CudaConfig, annotations: Mapping[str, str], container_id: str, config_file: str) -> bool:
    """Whether the restore bundle's annotation asks for a standby restore: an allow-listed value only, and
    "standby" only where the operator allows the annotation (cuda.standby_annotation)."""
    value = annotations.get(RESTORE_MODE_ANNOTATION)
    if value is None:
        return False
    said = f"container {container_id} carries the annotation {RESTORE_MODE_ANNOTATION}={value!r}"
    if value not in RESTORE_MODES:
        raise PolicyError(f"{said}: allowed values: {', '.join(RESTORE_MODES)}")
    if value == "standby" and not cuda.standby_annotation:
        raise PolicyError(f"{said}: a standby restore asked by the container is refused; the operator may allow it "
                          f"with cuda.standby_annotation = true in {config_file} (or restore with gpuckpt restore "
                          "--standby)")
    return value == "standby"
