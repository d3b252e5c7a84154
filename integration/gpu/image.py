"""The self-contained GPU image's root, built on the GPU machine from what it has: its torch interpreter (the venv's
own files and the Python it was made from), of the venv's site-packages only what the workloads import (torch and
the distributions it requires, walked from their metadata: the CUDA runtime wheels among them; numpy for
Tensor.numpy()), ldconfig, and every shared library those need, each at the path it has on the host. Triton and a
C toolchain for its launcher stubs come only when a selected scenario runs torch.compile (`--compile`): the venv
holds ~20 GB (scipy, jupyter, ...) that no workload loads, and a root that size overflowed the GPU machine's disk
in `podman import`. The driver is left out (libcuda, libnvidia-*): in CDI mode only the CDI spec brings it, as on
a node running `pytorch/pytorch` or `nvcr.io/nvidia/*` images. Phases: interpreter trees, site-packages closure,
toolchain packages, shared-library closure, /etc, then `podman import` of it as an image (engines) or an overlay
lower layer (runc bundles).

    python3 image.py ROOT [PYTHON] [--compile]   build ROOT (default PYTHON: /opt/torch/.venv/bin/python3)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# the driver's files: the node's, never the image's (the CDI spec mounts them; cdi.py)
DRIVER_LIBRARY = re.compile(r"lib(cuda|nvidia-[a-z0-9-]+|cudadebugger|nvcuvid|nvoptix)\.so")
STAMP = ".gpuckpt-image.json"
# what the workloads import (gpu_counter.py, train*.py: torch, Tensor.numpy()); their requirements come with them
WORKLOAD_PACKAGES = ("torch", "numpy")
# torch requires Triton on Linux, but loads it only for torch.compile: left out unless a scenario compiles
COMPILE_PACKAGES = ("triton",)
# The venv's distributions named and those they require (markers evaluated for this interpreter, with the
# extras each requirement asks for), each file from its RECORD: run by the venv's own python.
CLOSURE = r"""
import importlib.metadata as metadata, json, os, re, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
def key(name):
    return re.sub(r"[-_.]+", "-", name).lower()
wanted, left_out = json.loads(sys.argv[1]), {key(name) for name in json.loads(sys.argv[2])}
taken, missing, unlisted, files = [], [], [], []
pending, done = [(key(name), "") for name in wanted], set()
while pending:
    name, extra = pending.pop()
    if (name, extra) in done or name in missing or name in left_out:
        continue
    done.add((name, extra))
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        missing.append(name)
        continue
    if name not in taken:
        taken.append(name)
        if dist.files is None:  # no RECORD: its files cannot be told apart from the rest of site-packages
            unlisted.append(name)
        files += [os.path.normpath(dist.locate_file(f)) for f in dist.files or []]
    for line in dist.requires or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
            # torch requires cuda-toolkit[cudart,nvrtc,...]: the CUDA runtime wheels come through its extras
            pending += [(key(requirement.name), "")] + [(key(requirement.name), e) for e in requirement.extras]
print(json.dumps({"prefix": sys.prefix, "distributions": sorted(taken), "not_installed": sorted(missing),
                  "no_record": sorted(unlisted), "files": files}))
"""


def interpreter_trees(python: str) -> list[str]:
    """The venv (sys.prefix) and, from the interpreter it was made from, its executable, standard library and
    headers (Triton builds against Python.h)."""
    facts = json.loads(subprocess.run(
        [python, "-c", "import json, sys, sysconfig; print(json.dumps({'prefix': sys.prefix, 'base': sys.base_prefix,"
         " 'stdlib': sysconfig.get_paths()['stdlib'], 'include': sysconfig.get_paths()['include'],"
         " 'platinclude': sysconfig.get_paths()['platinclude'], 'config_h': sysconfig.get_config_h_filename(),"
         " 'executable': __import__('os').path.realpath(sys.executable),"
         " 'libdir': sysconfig.get_config_var('LIBDIR') or ''}))"],
        capture_output=True, text=True, check=True).stdout)
    trees = [facts["stdlib"], facts["include"], facts["platinclude"], facts["config_h"], facts["executable"]]
    # Debian's and Ubuntu's pyconfig.h include the multiarch one
    trees += [str(path) for path in Path("/usr/include").glob(f"*/{Path(facts['include']).name}")]
    # the venv's python links name the base interpreter by an absolute path: those links come too
    trees += [os.readlink(link) for link in Path(facts["prefix"], "bin").glob("python*")
              if link.is_symlink() and os.path.isabs(os.readlink(link))]
    if facts["prefix"] != facts["base"]:  # a venv: its own files (site-packages: site_packages())
        prefix = Path(facts["prefix"])
        trees[:0] = [str(path) for path in (prefix / "pyvenv.cfg", prefix / "bin") if path.exists()]
    if facts["base"] not in ("/usr", "/usr/local"):  # a standalone Python (uv's, pyenv's): take its whole prefix
        trees.append(facts["base"])
    libpython = sorted(Path(facts["libdir"]).glob("libpython3*.so*")) if facts["libdir"] else []
    return trees + [str(path) for path in libpython]


def site_packages(python: str, compile_: bool) -> dict:
    """The files of the venv's distributions the workloads need (CLOSURE), and which those are."""
    wanted = [*WORKLOAD_PACKAGES, *(COMPILE_PACKAGES if compile_ else ())]
    left_out = [] if compile_ else list(COMPILE_PACKAGES)
    walked = subprocess.run([python, "-I", "-c", CLOSURE, json.dumps(wanted), json.dumps(left_out)],
                            capture_output=True, text=True, check=False)
    if walked.returncode != 0:
        raise RuntimeError(f"{python}: walking the requirements of {', '.join(wanted)} failed: "
                           f"{walked.stderr.strip()[-500:]}")
    found: dict = json.loads(walked.stdout)
    if found["no_record"]:
        raise RuntimeError(f"{python}: {', '.join(found['no_record'])} installed without a RECORD file: which "
                           f"files are theirs is unknown (reinstall them with pip or uv)")
    if absent := [name for name in wanted if name in found["not_installed"]]:
        raise RuntimeError(f"{python} has no {', '.join(absent)} distribution: the image needs "
                           f"{', '.join(wanted)}")
    return found


def toolchain_packages() -> list[str]:
    """The dpkg packages owning gcc and what it needs to link a Python extension (cc1, as, ld, crt files, libc's
    and the kernel's headers), or [] where the host has no gcc (torch.compile then fails in the image too)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if not gcc or not shutil.which("dpkg"):
        return []
    def asked(*flag: str) -> str:
        return subprocess.run([gcc, *flag], capture_output=True, text=True, check=False).stdout.strip()
    files = [os.path.realpath(gcc), asked("-print-prog-name=cc1"), asked("-print-prog-name=as"),
             asked("-print-prog-name=ld"), asked("-print-file-name=crt1.o"), asked("-print-file-name=libc.so"),
             asked("-print-libgcc-file-name"), "/usr/include/stdio.h", "/usr/include/linux/limits.h",
             *map(str, Path("/usr/include").glob("*/asm/unistd.h"))]
    found = subprocess.run(["dpkg", "-S", *[os.path.realpath(f) for f in files if f and os.path.isabs(f)]],
                           capture_output=True, text=True, check=False).stdout
    packages = {line.split(":")[0] for line in found.splitlines() if ": " in line}
    return sorted(packages | {"binutils", "binutils-x86-64-linux-gnu"} & installed_packages())


def installed_packages() -> set[str]:
    listed = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\n"], capture_output=True, text=True, check=False)
    return set(listed.stdout.split())


def package_files(packages: list[str]) -> list[str]:
    if not packages:
        return []
    listed = subprocess.run(["dpkg", "-L", *packages], capture_output=True, text=True, check=False).stdout
    return [line for line in listed.splitlines() if line.startswith("/") and os.path.isfile(line)
            and not line.startswith(("/usr/share/doc", "/usr/share/man", "/usr/share/info", "/usr/share/locale"))]


def copy_path(source: str, root: Path) -> None:
    """`source` to the same path under `root`: a file with its symlink chain, a folder whole (`cp -a`)."""
    path = Path(source)
    while True:
        target = under(root, path)
        if target.exists() or target.is_symlink():
            return
        if path.is_symlink():
            link = os.readlink(path)
            target.symlink_to(link)
            path = Path(os.path.normpath(path.parent / link))
            continue
        if path.is_dir():  # hard links where the tree shares the filesystem (GBs of torch in no time): the
            # image's root is only ever read (an overlay's lower layer, a tar for `podman import`)
            if subprocess.run(["cp", "-al", str(path), str(target)], capture_output=True).returncode != 0:
                shutil.rmtree(target, ignore_errors=True)
                subprocess.run(["cp", "-a", str(path), str(target)], check=True)
        elif path.exists():
            try:  # the same filesystem: a hard link, no copy (the root is only ever read)
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)
        return


def under(root: Path, path: Path) -> Path:
    """Where `path` goes under `root`, its folders made and their symlinks (Ubuntu's /lib -> usr/lib) followed
    inside the root."""
    current = root
    for part in path.parent.parts[1:]:
        current = current / part
        for _ in range(40):
            if not current.is_symlink():
                break
            link = os.readlink(current)
            current = root / link.lstrip("/") if link.startswith("/") else current.parent / link
        current.mkdir(exist_ok=True)
    return current / path.name


def elf_files(root: Path) -> list[Path]:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.is_symlink() or not path.is_file() or (".so" not in name and not os.access(path, os.X_OK)):
                continue
            with open(path, "rb") as file:
                if file.read(4) == b"\x7fELF":
                    found.append(path)
    return found


def library_closure(root: Path) -> list[str]:
    """The host libraries every ELF file of the image links (ldd), less the driver's and those inside the image."""
    needed: set[str] = set()
    files = elf_files(root)
    for start in range(0, len(files), 64):
        listed = subprocess.run(["ldd", *map(str, files[start:start + 64])], capture_output=True, text=True,
                                check=False).stdout
        for line in listed.splitlines():
            found = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if found and not DRIVER_LIBRARY.search(os.path.basename(found.group(1))):
                needed.add(found.group(1))
    return sorted(path for path in needed if not (root / path.lstrip("/")).exists())


def write_etc(root: Path) -> None:
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    for name in ("passwd", "group", "nsswitch.conf", "hosts"):
        if os.path.isfile(f"/etc/{name}") and not (etc / name).exists():
            shutil.copy2(f"/etc/{name}", etc / name)
    (etc / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (etc / "ld.so.conf.d").mkdir(exist_ok=True)


def build(root: Path, python: str, compile_: bool = False) -> dict:
    """ROOT made (or kept, when its stamp says it was made from the same interpreter for the same scenarios): what
    went in. `compile_`: with Triton and gcc, for torch.compile."""
    stamp = root / STAMP
    if stamp.is_file() and (kept := json.loads(stamp.read_text())).get("python") == python and \
            kept.get("compile") == compile_:
        return kept
    if root.exists():
        shutil.rmtree(root)
    started = time.monotonic()
    for sub in ("proc", "dev", "sys", "tmp", "work", "root", "state", "run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for link in ("lib", "lib64", "bin", "sbin"):  # Ubuntu's merged /usr, as the bundles make it (LAB)
        if os.path.islink(f"/{link}"):
            (root / link).symlink_to(os.readlink(f"/{link}"))
    trees = interpreter_trees(python)
    for tree in trees:
        copy_path(tree, root)
    sites = site_packages(python, compile_)
    for path in sites["files"]:
        copy_path(path, root)
    venv_lib64 = Path(sites["prefix"], "lib64")  # a venv's lib64 -> lib: the link alone (copy_path follows it)
    if venv_lib64.is_symlink() and not os.path.lexists(under(root, venv_lib64)):
        under(root, venv_lib64).symlink_to(os.readlink(venv_lib64))
    packages = toolchain_packages() if compile_ else []
    for path in package_files(packages):
        copy_path(path, root)
    compilers = (shutil.which("gcc"), shutil.which("cc")) if compile_ else ()  # Triton's launcher stubs
    programs = (*compilers, "/usr/sbin/ldconfig", "/usr/sbin/ldconfig.real", "/usr/bin/dash",
                "/usr/bin/sh")  # ldconfig -p: Triton finds libcuda
    for program in programs:
        if program and os.path.lexists(program):
            copy_path(program, root)
    for _ in range(3):  # a library's own needs are found on the next pass
        missing = library_closure(root)
        for library in missing:
            copy_path(library, root)
        if not missing:
            break
    for loader in ("/lib64/ld-linux-x86-64.so.2",):
        copy_path(os.path.realpath(loader), root)
    write_etc(root)
    subprocess.run(["ldconfig", "-r", str(root)], check=False, capture_output=True)
    # a wheel's stub libcuda would be no driver: noted, for the reader of the results
    driver_like = [str(p.relative_to(root)) for p in root.rglob("libcuda.so*")]
    size = int(subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True).stdout.split()[0])
    facts = {"python": python, "compile": compile_, "trees": trees, "distributions": sites["distributions"],
             "not_installed": sites["not_installed"], "toolchain_packages": packages, "bytes": size,
             "build_s": round(time.monotonic() - started, 1), "libcuda_named_files": driver_like[:8]}
    stamp.write_text(json.dumps(facts, indent=1))
    return facts


def podman_import(podman: list[str], root: Path, image: str, env: dict[str, str] | None = None) -> dict:
    """ROOT as the engine's image `image` (a tar streamed, no copy of it on disk), unless the image there was
    imported from this very root (its label holds the stamp's build). podman 4.3 copies stdin to a file in TMPDIR,
    then the blob again to its image-copy folder (TMPDIR too), then unpacks the layer: the two copies go to
    /dev/shm where it has room, so the disk takes the layer alone. What it took."""
    built = json.loads((root / STAMP).read_text())
    label = f"{built['bytes']}-{int(built['compile'])}-{built.get('build_s', 0)}"
    present = subprocess.run([*podman, "image", "inspect", "--format", '{{index .Labels "io.gpuckpt.image-root"}}',
                              image], env=env, capture_output=True, text=True, check=False)
    if present.returncode == 0 and present.stdout.strip() == label:
        return {"image_import": "kept"}
    if present.returncode == 0:
        subprocess.run([*podman, "rmi", "-f", image], env=env, capture_output=True, check=False)
    env = dict(env if env is not None else os.environ)
    room = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    if room > 2 * built["bytes"] + (4 << 30):  # two copies, and room left for the workloads' own /dev/shm
        env["TMPDIR"] = "/dev/shm"
    started = time.monotonic()
    tar = subprocess.Popen(["tar", "-C", str(root), "--exclude", f"./{STAMP}", "-cf", "-", "."],
                           stdout=subprocess.PIPE)
    imported = subprocess.run([*podman, "import", "--change", f"LABEL io.gpuckpt.image-root={label}", "-", image],
                              stdin=tar.stdout, env=env, capture_output=True, text=True, check=False)
    assert tar.stdout is not None
    tar.stdout.close()
    if tar.wait() != 0 or imported.returncode != 0:
        raise RuntimeError(f"podman import of {root} as {image} failed: {imported.stderr.strip()[-500:]}")
    return {"image_import": "imported", "image_import_tmpdir": env.get("TMPDIR", "(podman's default)"),
            "image_import_s": round(time.monotonic() - started, 1), "image_bytes": built["bytes"]}


if __name__ == "__main__":
    arguments = [arg for arg in sys.argv[1:] if arg != "--compile"]
    if len(arguments) not in (1, 2) or any(arg.startswith("-") for arg in arguments):
        sys.exit(__doc__.split("\n\n")[-1].strip())
    print(json.dumps(build(Path(arguments[0]), arguments[1] if len(arguments) == 2 else "/opt/torch/.venv/bin/python3",
                           "--compile" in sys.argv[1:]), indent=1))
