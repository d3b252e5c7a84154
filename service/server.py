"""gpuckptd's local API: a unix socket only root may use (mode 0600, and the peer's uid checked
with SO_PEERCRED), one JSON request line in, JSON event lines out as the work goes on."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable

from ..errors import GpuckptError
from .api import MAX_LINE_BYTES, Event, Request, Result, Status, parse_request
from .operations import Operations
from .pool import Pool
from .preemption import PreemptionWatch
from .schedule import Schedule
from .systemd import log

_UCRED = struct.Struct("3i")  # pid, uid, gid
REQUEST_TIMEOUT_S = 30.0
SEND_TIMEOUT_S = 10.0


def _peer_uid(connection: socket.socket) -> int:
    uid: int = _UCRED.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))[1]
    return uid


def _read_line(connection: socket.socket) -> bytes:
    data = b""
    while b"\n" not in data and len(data) <= MAX_LINE_BYTES:
        chunk = connection.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


class Server:
    def __init__(self, path: str, operations: Operations, preemption: PreemptionWatch, schedule: Schedule, *,
                 drains_on_stop: bool, pool: Pool | None = None) -> None:
        self.path, self.operations, self.preemption, self.schedule = path, operations, preemption, schedule
        self.drains_on_stop, self.pool = drains_on_stop, pool
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)  # a socket left by a service that did not stop cleanly
        except FileNotFoundError:
            pass
        old_umask = os.umask(0o177)
        try:
            self.listener.bind(path)  # fails on anything else at that path: not ours to remove
        finally:
            os.umask(old_umask)
        self.listener.listen(16)
        self._thread = threading.Thread(target=self._accept, name="api", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _answer(self, request: Request, emit: Callable[[Event], None]) -> None:
        if request.op == "status":
            emit(self.status())
        elif request.op == "drain":
            self.operations.drain(emit, request.deadline_s, only=request.containers)
        elif request.op == "reset":
            emit(self.preemption.reset())
        elif request.op.startswith("pool-"):
            self._pool(request.op, request.checkpoint, emit)
        else:
            self.operations.restore(self._noting_preemption(emit))

    def status(self) -> Status:
        """The operations' view, with the preemption's state and the periodic schedule."""
        return self.operations.status().model_copy(update={
            "drains_on_stop": self.drains_on_stop, "preemption": self.preemption.view(),
            "periodic": self.schedule.view()})

    def _noting_preemption(self, emit: Callable[[Event], None]) -> Callable[[Event], None]:
        """`emit`, whose result says so where a preemption is still pending after a restore (the containers are
        back, but periodic checkpoints wait and notices are not watched until a reset)."""
        def noted(event: Event) -> None:
            if isinstance(event, Result) and self.preemption.pending:
                event = event.model_copy(update={"message": f"{event.message}; a preemption is still pending: "
                                                 "periodic checkpoints wait and new notices are not watched until "
                                                 "`gpuckpt service reset`"})
            emit(event)
        return noted

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed: the service is stopping
            threading.Thread(target=self._serve, args=(connection,), name="api-client", daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        lock = threading.Lock()  # drain threads report at once

        gone = threading.Event()

        def emit(event: Event) -> None:
            with lock:
                if gone.is_set():
                    return
                try:
                    connection.sendall(event.model_dump_json().encode() + b"\n")
                except OSError:  # went away, or reads nothing for SEND_TIMEOUT_S: the work goes on, the journal has it
                    gone.set()

        with connection:
            try:
                connection.settimeout(REQUEST_TIMEOUT_S)  # a client that never finishes its line holds nothing
                line = _read_line(connection)  # read before any answer: unread bytes would reset the connection
                connection.settimeout(SEND_TIMEOUT_S)  # from here on: a client that stops reading is dropped
                if _peer_uid(connection) != 0:
                    emit(Result(ok=False, message="gpuckptd: only root may use this socket"))
                    return
                self._answer(parse_request(line), emit)
            except GpuckptError as error:
                emit(Result(ok=False, message=str(error)))
            except TimeoutError:
                emit(Result(ok=False, message=f"gpuckptd: no request line within {REQUEST_TIMEOUT_S:g} s"))
            except Exception as error:  # noqa: BLE001 -- one request's bug must not end the service: the client gets a line, the journal the detail
                log(f"internal error serving a request: {type(error).__name__}: {error}")
                emit(Result(ok=False, message=f"gpuckptd internal error: {type(error).__name__}: {error}"))

    def _pool(self, op: str, checkpoint: str | None, emit: Callable[[Event], None]) -> None:
        if self.pool is None:
            emit(Result(ok=False, message="gpuckptd: this service runs no warm pool"))
        elif op == "pool-status":
            emit(self.pool.state())
        elif not checkpoint:
            emit(Result(ok=False, message="gpuckptd: pool-take names no checkpoint"))
        else:
            record, seconds = self.pool.take(checkpoint)
            emit(Result(ok=True, message=f"{record.container} ({record.container_id[:12]}) resumed from standby in "
                                         f"{seconds:.2f} s", done=[record.container]))
