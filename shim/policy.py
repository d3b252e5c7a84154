"""What a container may ask of the shim's CRIU calls: the operator decides, not the spec.

Checked by both owned verbs before anything runs, on the annotations runc keeps for
the container (its state) and those of the bundle it is restored from.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuckpt.errors import GpuckptError

CRIU_CONFIG_ANNOTATION = "org.criu.config"


class PolicyError(GpuckptError):
    """A container asked for something the operator has not allowed."""


def refuse_container_criu_config(annotations: Mapping[str, str], container_id: str, allowed: bool,
                                 config_file: str) -> None:
    """runc would hand CRIU the config file this annotation names: refuse it unless allowed."""
    if CRIU_CONFIG_ANNOTATION in annotations and not allowed:
        raise PolicyError(
            f"container {container_id} carries the annotation {CRIU_CONFIG_ANNOTATION}="
            f"{annotations[CRIU_CONFIG_ANNOTATION]!r}: a CRIU configuration chosen by the container is refused; "
            f"the operator may allow it with criu.allow_container_config = true in {config_file}")
