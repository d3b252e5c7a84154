# A TCP server for the connection test: acknowledges each numbered line on one connection.
import socket
import sys

server = socket.create_server((sys.argv[1], int(sys.argv[2])))
connection, _ = server.accept()
lines = connection.makefile("rb")
while True:
    line = lines.readline()
    if not line:
        break
    connection.sendall(b"ack " + line)
