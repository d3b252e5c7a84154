"""Crafted gpuckpt-devshm.tar files against the installed shim's code (transfer.root_files), as root, in a scratch
directory of its own: each case says whether it was refused and what was made where."""
import io, json, os, shutil, sys, tarfile, tempfile
from gpuckpt.host.rooted import RootedTree
from gpuckpt.transfer import root_files
from gpuckpt.errors import ImageError

base = tempfile.mkdtemp(prefix="attack30m-")
outside = os.path.join(base, "outside"); os.mkdir(outside)
open(os.path.join(outside, "secret"), "w").write("host")

def tar_of(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()

def reg(name, data=b"x", mode=0o644):
    i = tarfile.TarInfo(name); i.size = len(data); i.mode = mode; return (i, data)
def link(name, target, kind):
    i = tarfile.TarInfo(name); i.type = kind; i.linkname = target; return (i, None)
def node(name, kind):
    i = tarfile.TarInfo(name); i.type = kind; i.devmajor, i.devminor = 1, 3; return (i, None)

cases = {
    "dotdot": [reg("../escaped")],
    "absolute": [reg(str(os.path.join(outside, "abs")))],
    "symlink_out_then_file": [link("l", outside, tarfile.SYMTYPE), reg("l/through")],
    "symlink_out_alone": [link("l", "/etc/shadow", tarfile.SYMTYPE)],
    "hardlink_abs_host": [link("h", os.path.join(outside, "secret"), tarfile.LNKTYPE)],
    "hardlink_dotdot": [link("h", "../outside/secret", tarfile.LNKTYPE)],
    "hardlink_via_symlink": [link("l", outside, tarfile.SYMTYPE), link("h", "l/secret", tarfile.LNKTYPE)],
    "chardev": [node("null", tarfile.CHRTYPE)],
    "blockdev": [node("sda", tarfile.BLKTYPE)],
    "fifo": [node("f", tarfile.FIFOTYPE)],
    "setuid": [reg("suid", b"\x7fELF", 0o4755)],
    "directory_and_file": [(lambda i: (setattr(i, "type", tarfile.DIRTYPE), setattr(i, "mode", 0o777), (i, None))[-1])(tarfile.TarInfo("d")), reg("d/f")],
    "plain_files_and_hardlink": [reg("sem.a", b"abcd"), link("b", "sem.a", tarfile.LNKTYPE)],
}
results = {}
for name, entries in cases.items():
    shm = os.path.join(base, name, "shm"); os.makedirs(shm)
    path = os.path.join(base, name, "gpuckpt-devshm.tar"); open(path, "wb").write(tar_of(entries))
    try:
        with RootedTree(shm) as tree:
            n = root_files._apply_diff(tree, path, False, name)
        outcome = f"applied {n}"
    except ImageError as e:
        outcome = f"refused: {e}"
    except Exception as e:
        outcome = f"CRASH {type(e).__name__}: {e}"
    made = sorted(os.listdir(shm))
    results[name] = {"outcome": outcome, "in_shm": made, "outside": sorted(os.listdir(outside)),
                     "modes": {m: oct(os.lstat(os.path.join(shm, m)).st_mode) for m in made}}

# replace_devshm: podman's directory of the bundle emptied first; a deep directory left there by podman's own untar
storage = os.path.join(base, "graph"); bundle = os.path.join(storage, "overlay-containers", "c" * 64, "userdata")
shm = os.path.join(bundle, "shm"); os.makedirs(shm)
image = os.path.join(base, "img"); os.makedirs(image)
open(os.path.join(image, "gpuckpt-devshm.tar"), "wb").write(tar_of([reg("sem.x")]))
deep = shm  # a 1200-deep chain, as podman's own untar of an edited devshm-checkpoint.tar leaves it
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1200):
    deep = os.path.join(deep, "d")
    if len(deep) > 3900:  # past PATH_MAX: go on from inside
        os.chdir(os.path.dirname(deep)); deep = "d"
    os.mkdir(deep)
os.chdir(base)
class Spec:
    def bind_source(self, dest): return shm
try:
    results["replace_devshm_deep_dir"] = root_files.replace_devshm(Spec(), bundle, image, "probe")
except ImageError as e:
    results["replace_devshm_deep_dir"] = f"refused: {e}"
except Exception as e:
    results["replace_devshm_deep_dir"] = f"CRASH {type(e).__name__}: {str(e)[:200]}"
print(json.dumps(results, indent=1))
os.system(f"rm -rf {base}")  # shutil.rmtree recurses too
