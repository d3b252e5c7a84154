"""The exit statuses of `gpuckpt`: one table from the error hierarchy (errors.py and the layers' own
subclasses) to a status a script can tell apart, documented in docs/cli-output.md.

Only the command for people uses it; gpuckpt-runtime keeps runc's statuses (errors.GpuckptError.exit_status).
The first row whose classes match the error wins, so a subclass is listed before its base.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import (
    CheckpointRefusedError,
    ConfigError,
    DelegateError,
    DriverError,
    EngineConfigError,
    GpuCheckpointError,
    ImageError,
    NotFoundError,
    NotRootError,
    ServiceRefusedError,
    UnsafeNodeError,
    UsageError,
)
from ..host.programs import CommandError
from ..policy.annotations import PolicyError

OK = 0
FAILED = 1  # any other error: an I/O error, a full disk, a busy lock
INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it; SIGTERM and SIGHUP: 128 + the signal


class ExitCode(NamedTuple):
    status: int
    meaning: str
    errors: tuple[type[BaseException], ...]


EXIT_CODES = (
    ExitCode(4, "not found: no such container, pod, file, archive or stored checkpoint", (NotFoundError,)),
    ExitCode(2, "bad input: a command line or configuration value gpuckpt cannot accept", (UsageError, ConfigError)),
    ExitCode(3, "refused: by the trust or import policy, or a checkpoint, archive or node that checks refuse",
             (PolicyError, ImageError, CheckpointRefusedError, UnsafeNodeError, ServiceRefusedError)),
    ExitCode(5, "engine failed: podman, docker, runc, CRIU or the CUDA driver failed",
             (CommandError, DelegateError, DriverError, GpuCheckpointError, EngineConfigError)),
    ExitCode(6, "must be root: the command needs root and was run by another user", (NotRootError,)),
)


def exit_status(error: BaseException) -> int:
    """The status `gpuckpt` exits with for `error`."""
    for row in EXIT_CODES:
        if isinstance(error, row.errors):
            return row.status
    return FAILED
