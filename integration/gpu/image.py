"""The self-contained GPU image's root, built on the GPU machine from what it has: its torch interpreter (the venv
and the Python it was made from), the CUDA runtime libraries that come with torch, a C toolchain for Triton's
launcher stubs (torch.compile), ldconfig, and every shared library those need, each at the path it has on the host.
The driver is left out (libcuda, libnvidia-*): in CDI mode only the CDI spec brings it, as on a node running
`pytorch/pytorch` or `nvcr.io/nvidia/*` images. Phases: interpreter trees, toolchain packages, shared-library
closure, /etc, then `podman import` of it as an image (engines) or an overlay lower layer (runc bundles).

    python3 image.py ROOT [PYTHON]    build ROOT (default PYTHON: /opt/torch/.venv/bin/python3)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# the driver's files: the node's, never the image's (the CDI spec mounts them; cdi.py)
DRIVER_LIBRARY = re.compile(r"lib(cuda|nvidia-[a-z0-9-]+|cudadebugger|nvcuvid|nvoptix)\.so")
STAMP = ".gpuckpt-image.json"


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
    if facts["prefix"] != facts["base"]:  # a venv: the whole of it (torch and the CUDA runtime wheels)
        trees.insert(0, facts["prefix"])
    if facts["base"] not in ("/usr", "/usr/local"):  # a standalone Python (uv's, pyenv's): take its whole prefix
        trees.append(facts["base"])
    libpython = sorted(Path(facts["libdir"]).glob("libpython3*.so*")) if facts["libdir"] else []
    return trees + [str(path) for path in libpython]


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


def build(root: Path, python: str) -> dict:
    """ROOT made (or kept, when its stamp says it was made from the same interpreter): what went in."""
    stamp = root / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("python") == python:
        return json.loads(stamp.read_text())
    if root.exists():
        shutil.rmtree(root)
    for sub in ("proc", "dev", "sys", "tmp", "work", "root", "state", "run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for link in ("lib", "lib64", "bin", "sbin"):  # Ubuntu's merged /usr, as the bundles make it (LAB)
        if os.path.islink(f"/{link}"):
            (root / link).symlink_to(os.readlink(f"/{link}"))
    trees = interpreter_trees(python)
    for tree in trees:
        copy_path(tree, root)
    packages = toolchain_packages()
    for path in package_files(packages):
        copy_path(path, root)
    programs = (shutil.which("gcc"), shutil.which("cc"), "/usr/sbin/ldconfig", "/usr/sbin/ldconfig.real",
                "/usr/bin/dash", "/usr/bin/sh")  # gcc/cc: Triton's launcher stubs; ldconfig -p: Triton finds libcuda
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
    facts = {"python": python, "trees": trees, "toolchain_packages": packages, "bytes": size,
             "libcuda_named_files": driver_like[:8]}
    stamp.write_text(json.dumps(facts, indent=1))
    return facts


def podman_import(podman: list[str], root: Path, image: str, env: dict[str, str] | None = None) -> None:
    """ROOT as the engine's image `image` (tar streamed, no copy on disk), unless it is there already."""
    if subprocess.run([*podman, "image", "exists", image], env=env, check=False).returncode == 0:
        return
    tar = subprocess.Popen(["tar", "-C", str(root), "--exclude", f"./{STAMP}", "-cf", "-", "."],
                           stdout=subprocess.PIPE)
    imported = subprocess.run([*podman, "import", "-", image], stdin=tar.stdout, env=env, capture_output=True,
                              text=True, check=False)
    assert tar.stdout is not None
    tar.stdout.close()
    if tar.wait() != 0 or imported.returncode != 0:
        raise RuntimeError(f"podman import of {root} as {image} failed: {imported.stderr.strip()[-500:]}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.split("\n\n")[1].strip())
    print(json.dumps(build(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) == 3 else "/opt/torch/.venv/bin/python3"),
                     indent=1))
