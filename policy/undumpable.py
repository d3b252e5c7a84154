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
from ..host.processes import Processes, read_processes

IO_URING = "anon_inode:[io_uring]"


def io_uring_holders(pids: list[int]) -> list[int]:
    return [process.pid for process in read_processes(pids) if process.holds(IO_URING)]


def undumpable_refusals(container_id: str, processes: Processes) -> list[str]:
    """The container's processes that CRIU cannot dump, as refusal lines (none: it can)."""
    holders = [process for process in processes if process.holds(IO_URING)]
    if not holders:
        return []
    named = ", ".join(f"{process.pid} (pid {process.container_pid} in the container)" for process in holders)
    return [f"checkpoint of {container_id} refused: process(es) {named} use io_uring, which CRIU cannot dump; "
            "torch.distributed's TCPStore makes one through libuv: start the job with USE_LIBUV=0 "
            "(other libuv programs: UV_USE_IO_URING=0)"]


def refuse_undumpable(container_id: str, pids: list[int]) -> None:
    """undumpable_refusals of the processes `pids` as they are now."""
    for refusal in undumpable_refusals(container_id, read_processes(pids)):
        raise CheckpointRefusedError(refusal)
