"""The commands that unwind at SIGTERM and SIGHUP as at Ctrl-C (host/signals.py): those that stage files
(an import's staging directory) or stop a container (an export, a store checkpoint: put back from its
checkpoint, node/put_back.py), and a group's checkpoint or restore (service/group.py: the group put back).
"""

from __future__ import annotations

from ..host.signals import Terminated, termination_deferred, unwind_at_termination

__all__ = ["UNWOUND_AT_TERM", "Terminated", "termination_deferred", "unwind_at_termination"]

UNWOUND_AT_TERM = frozenset({"import", "export", "store", "checkpoint", "restore"})
