"""What CRIU cannot dump, found before anything is locked or frozen.

A GPU checkpoint moves every CUDA process's device memory to the host before CRIU
runs; learning only then that CRIU cannot dump the container costs that move and
a rollback, and CRIU's own message is cryptic. CRIU 4.2 cannot dump io_uring
instances (seen on 2x H200: "Unknown shit 600 (anon_inode:[io_uring])" for a
torch.distributed job: libuv, behind its TCPStore server, makes one; torch's copy
of libuv ignored UV_USE_IO_URING=0 there, USE_LIBUV=0 avoided it).
"""

from __future__ import annotations

from ..errors import CheckpointRefusedError
from ..host.procfs import container_pid, fd_targets, mapped_targets

IO_URING = "anon_inode:[io_uring]"


def io_uring_holders(pids: list[int]) -> list[int]:
    holding = {pid for pid, target in fd_targets(pids) if target == IO_URING}
    holding |= {pid for pid, target in mapped_targets(pids) if target == IO_URING}
    return sorted(holding)


def refuse_undumpable(container_id: str, pids: list[int]) -> None:
    holders = io_uring_holders(pids)
    if holders:
        named = ", ".join(f"{pid} (pid {container_pid(pid)} in the container)" for pid in holders)
        raise CheckpointRefusedError(
            f"checkpoint of {container_id} refused: process(es) {named} use io_uring, which CRIU cannot dump; "
            "torch.distributed's TCPStore makes one through libuv: start the job with USE_LIBUV=0 "
            "(other libuv programs: UV_USE_IO_URING=0)")
