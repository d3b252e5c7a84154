# The client side of the connection test, run in another network namespace: sends numbered
# lines on ONE connection, one every 0.1 s, and records each acknowledgement (or the error).
import socket
import sys
import time

host, port, count, record = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with open(record, "w", buffering=1) as out:
    try:
        connection = socket.create_connection((host, port), timeout=60)
        replies = connection.makefile("rb")
        for number in range(1, count + 1):
            connection.sendall(f"{number}\n".encode())
            out.write(replies.readline().decode() or "EOF\n")
            time.sleep(0.1)
        out.write("DONE\n")
    except OSError as error:
        out.write(f"ERROR {type(error).__name__}: {error}\n")
