#!/usr/bin/python3
"""recvtty for runc's integration tests, in Python: the Go one ships in runc's source tree only.

Accepts runc's --console-socket connections, takes each pty master runc sends (SCM_RIGHTS) and, as
`--mode null` does, reads and discards its output for as long as it is open. Only the options
tests/integration/helpers.bash passes: --pid-file FILE --mode null SOCKET.
"""

from __future__ import annotations

import argparse
import array
import os
import socket
import sys
import threading


def drain(master: int) -> None:
    """--mode null: the container's terminal output read and dropped until it closes."""
    try:
        while os.read(master, 65536):
            pass
    except OSError:
        pass  # EIO: the last slave side closed
    finally:
        os.close(master)


def take_master(connection: socket.socket) -> int | None:
    """The one fd runc sends with the terminal's name, None if it sent none."""
    fds = array.array("i")
    _, ancillary, _, _ = connection.recvmsg(4096, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return fds[0] if fds else None


def main() -> int:
    parser = argparse.ArgumentParser(prog="recvtty")
    parser.add_argument("--pid-file", default="")
    parser.add_argument("--mode", default="null", choices=["null"])
    parser.add_argument("socket_path")
    args = parser.parse_args()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket_path)
    listener.listen(16)
    if args.pid_file:
        with open(args.pid_file, "w", encoding="ascii") as pid_file:
            pid_file.write(str(os.getpid()))
    while True:  # run and restore of one test send one terminal each to the same socket
        connection, _ = listener.accept()
        with connection:
            master = take_master(connection)
        if master is not None:
            threading.Thread(target=drain, args=(master,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
