# Two ranks of a job in separate containers of one pod, talking over the pod's loopback (the CPU stand-in for
# NCCL between containers): `server` and `client` pass a counter back and forth over one TCP connection, each
# writing "token count digest" to /tmp/state after every message (bed.Counter's format). Restored, both go on
# from their counts on the same connection; a connection reset ends them.
import os
import socket
import sys
import time

PORT = 47311
role = sys.argv[1]
token = os.urandom(8).hex()
if role == "server":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", PORT))
    server.listen()
    peer, _ = server.accept()
else:
    while True:
        try:
            peer = socket.create_connection(("127.0.0.1", PORT))
            break
        except OSError:
            time.sleep(0.1)
    peer.sendall((0).to_bytes(8, "big"))
while True:
    data = b""
    while len(data) < 8:
        chunk = peer.recv(8 - len(data))
        if not chunk:
            raise SystemExit("peer closed the connection")
        data += chunk
    count = int.from_bytes(data, "big")
    with open("/tmp/state.new", "w") as state:
        state.write(f"{token} {count} {'connected' * 8}\n")
    os.replace("/tmp/state.new", "/tmp/state")
    time.sleep(0.05)
    peer.sendall((count + 1).to_bytes(8, "big"))
