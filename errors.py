"""The error hierarchy of gpuckpt.

`str(error)` is the one line a user (or an engine, through runc's log) sees;
the CLI edges turn an error into that line and an exit status, once: the runtime into runc's
(`exit_status`), the `gpuckpt` command through cli/exit_codes.py's table.
"""

from __future__ import annotations

# runc (urfave/cli) exits 1 on every error of its own; a child's status passes through.
EXIT_FAILURE = 1


class GpuckptError(Exception):
    """Base of every error gpuckpt reports; its message is the user's one line."""

    exit_status = EXIT_FAILURE


class UsageError(GpuckptError):
    """A command line gpuckpt cannot accept."""


class NotFoundError(UsageError):
    """A name or path given on the command line names nothing (no such container, file, checkpoint)."""


class NotRootError(GpuckptError):
    """A command that changes or reads root-only node state, run by another user."""


class ConfigError(GpuckptError):
    """The configuration file is unreadable or invalid."""


class DelegateError(GpuckptError):
    """The delegate runtime is missing or failed; carries its exit status."""

    def __init__(self, message: str, exit_status: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_status = exit_status if exit_status > 0 else EXIT_FAILURE


class DriverError(GpuckptError):
    """The CUDA driver refused a call; carries the CUDA error name."""

    def __init__(self, message: str, cuda_error: str = "") -> None:
        super().__init__(message)
        self.cuda_error = cuda_error


class GpuCheckpointError(GpuckptError):
    """A GPU checkpoint or restore could not be done (after any rollback)."""


class ImageError(GpuckptError):
    """A checkpoint image, archive or manifest is invalid or unsafe."""


class EngineConfigError(GpuckptError):
    """An engine's own configuration (containers.conf, daemon.json) cannot be updated."""


class CheckpointRefusedError(GpuckptError):
    """The container holds something CRIU cannot dump; refused before anything was touched."""


class UnsafeNodeError(GpuckptError):
    """The node is in a state where the delegate would do harm beyond the container; nothing was touched."""


class ServiceRefusedError(GpuckptError):
    """gpuckptd refused a request in the state it is in (a preemption reset while a notice stands); nothing changed."""
