"""A CDI spec for the node's NVIDIA GPUs in the shape `nvidia-ctk cdi generate` writes, made from the node's own
driver files (nvidia-ctk is not installed on the GPU machine nor packaged anywhere the test bed reaches), and the
hook program that spec names. Phases: discover (driver version, its files, device nodes), build the spec, write it.

The shape follows github:NVIDIA/nvidia-container-toolkit (v1.20.0-27-gd34b3046):
  pkg/nvcdi/common-nvml.go     control nodes /dev/nvidia-modeset, -uvm-tools, -uvm, nvidiactl in the common edits
  pkg/nvcdi/full-gpu-nvml.go   one device per GPU ("0", its UUID) holding /dev/nvidiaN; "all" merges them
                               (/dev/nvidia-caps/* come only with MIG devices and the management spec,
                               pkg/nvcdi/management.go: none for a whole GPU)
  pkg/nvcdi/driver-nvml.go     libraries `*.so.<driver version>` (ldcache), binaries (nvidia-smi, ...), GSP
                               firmware `nvidia/<version>/gsp*.bin` under the firmware search paths, env
                               NVIDIA_CTK_LIBCUDA_DIR
  internal/discover/mounts.go  each file mounted at its host path: ["ro", "nosuid", "nodev", "rbind", "rprivate"]
                               (v1.18 added rprivate; before, ["ro", "nosuid", "nodev", "bind"])
  internal/discover/ipc.go     /run/nvidia-persistenced/socket, /run/nvidia-fabricmanager/socket:
                               ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
  internal/discover/symlinks.go  create-symlinks: SONAME -> file, .so -> SONAME where the host has those links,
                               and libcuda.so -> libcuda.so.1
  internal/discover/ldconfig.go  update-ldcache --folder for each library folder
  internal/discover/hooks.go   every hook is a createContainer hook; args [<hook binary>, <hook name>, ...]
  pkg/nvcdi/lib_test.go        the common edits' env NVIDIA_VISIBLE_DEVICES=void
Hooks: nvidia-ctk's name its own binary (`nvidia-cdi-hook create-symlinks --link T::L`, `update-ldcache --folder
D`), which does not exist here; the spec names this file's launcher instead with the same sub-commands and
arguments, and it does the same in the container's root (`python3 cdi.py hook ...`). Two of nvidia-ctk's hooks are
left out: disable-device-node-modification (mounts a rewritten /proc/driver/nvidia/params over the real one: the
device nodes are all given, so nothing would be created) and enable-cuda-compat (only for images holding
/usr/local/cuda/compat; ours holds none).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

CDI_VERSION = "0.5.0"  # hostPath on device nodes needs 0.5.0; podman 4.3.1 reads it (LAB)
KIND = "nvidia.com/gpu"
FILE_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
IPC_OPTIONS = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
CONTROL_NODES = ("/dev/nvidia-modeset", "/dev/nvidia-uvm-tools", "/dev/nvidia-uvm", "/dev/nvidiactl")
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl")
IPC_SOCKETS = ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket")
# where the driver's libraries are looked for beside the ld cache: the GPU machine keeps them in
# /usr/local/nvidia/lib64, which its ld cache does not list (LAB)
LIBRARY_DIRS = ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib")
BINARY_DIRS = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/sbin", "/bin", "/sbin")


@dataclass
class DriverFiles:
    """What a node's driver consists of, as container paths (the host path is `root` + the path)."""

    root: Path
    version: str
    libraries: list[str] = field(default_factory=list)
    binaries: list[str] = field(default_factory=list)
    firmware: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)
    control_nodes: list[str] = field(default_factory=list)
    gpus: dict[str, str] = field(default_factory=dict)  # index -> /dev/nvidiaN
    uuids: dict[str, str] = field(default_factory=dict)  # index -> GPU-...

    def host(self, path: str) -> str:
        return str(self.root / path.lstrip("/")) if self.root != Path("/") else path


def driver_version(root: Path = Path("/")) -> str:
    """The loaded kernel module's version: /sys/module/nvidia/version, else /proc/driver/nvidia/version's line."""
    module = root / "sys/module/nvidia/version"
    if module.is_file():
        return module.read_text().strip()
    proc = root / "proc/driver/nvidia/version"
    if proc.is_file():
        found = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", proc.read_text())
        if found:
            return found.group(1)
    raise RuntimeError(f"no NVIDIA driver version under {root}: needs sys/module/nvidia/version or "
                       f"proc/driver/nvidia/version")


def ldcache_dirs(root: Path) -> list[str]:
    """The folders `ldconfig -p` lists libraries in (the host's only: a fake root has no ld cache of its own)."""
    if root != Path("/"):
        return []
    listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    return sorted({os.path.dirname(line.rpartition("=> ")[2]) for line in listed.splitlines() if "=> " in line})


def discover(root: Path = Path("/"), version: str | None = None, uuids: dict[str, str] | None = None) -> DriverFiles:
    """The driver's files under `root` (the node, or a fake tree in the tests), found as nvidia-ctk finds them."""
    version = version or driver_version(root)
    found = DriverFiles(root=root, version=version, uuids=dict(uuids or {}))
    seen: set[str] = set()
    extra = os.environ.get("LD_LIBRARY_PATH", "").split(":") if root == Path("/") else []
    for folder in dict.fromkeys([*LIBRARY_DIRS, *extra, *ldcache_dirs(root)]):
        directory = root / folder.lstrip("/")
        if not folder or not directory.is_dir():
            continue
        for path in sorted(directory.glob(f"*.so.{version}")):
            real = os.path.realpath(path)
            if path.is_file() and not path.is_symlink() and real not in seen:
                seen.add(real)
                found.libraries.append("/" + str(path.relative_to(root)))
        # nvcdi's legacy NVVM library, versioned by its own number
        found.libraries += ["/" + str(p.relative_to(root)) for p in sorted(directory.glob("libnvidia-nvvm70.so.*"))
                            if p.is_file() and not p.is_symlink() and os.path.realpath(p) not in seen]
    for name in BINARIES:
        for folder in BINARY_DIRS:
            path = root / folder.lstrip("/") / name
            if path.is_file() and os.access(path, os.X_OK):
                found.binaries.append(f"{folder}/{name}")
                break
    for folder in firmware_search_paths(root):
        found.firmware += ["/" + str(p.relative_to(root))
                           for p in sorted((root / folder.lstrip("/") / "nvidia" / version).glob("gsp*.bin"))]
    found.sockets = [path for path in IPC_SOCKETS if (root / path.lstrip("/")).exists()]
    found.control_nodes = [path for path in CONTROL_NODES if (root / path.lstrip("/")).exists()]
    for node in sorted((root / "dev").glob("nvidia[0-9]*"), key=lambda p: int(p.name.removeprefix("nvidia"))):
        found.gpus[node.name.removeprefix("nvidia")] = f"/dev/{node.name}"
    if not found.gpus:
        raise RuntimeError(f"no GPU device nodes under {root / 'dev'} (nvidia0, nvidia1...)")
    if not any(Path(lib).name.startswith("libcuda.so.") for lib in found.libraries):
        raise RuntimeError(f"no libcuda.so.{version} under {root} in {', '.join(LIBRARY_DIRS)} or the ld cache")
    return found


def firmware_search_paths(root: Path) -> list[str]:
    """nvcdi's getFirmwareSearchPaths: the firmware class's own path, then /lib/firmware[/updates][/<release>]."""
    custom = root / "sys/module/firmware_class/parameters/path"
    release = os.uname().release
    paths = [custom.read_text().strip()] if custom.is_file() and custom.read_text().strip() else []
    return [*paths, f"/lib/firmware/updates/{release}", "/lib/firmware/updates", f"/lib/firmware/{release}",
            "/lib/firmware"]


def symlinks(files: DriverFiles) -> list[str]:
    """create-symlinks' `target::link` pairs: libcuda.so -> libcuda.so.1, and per library its SONAME link and .so
    link where the host has them (nvidia-ctk reads the SONAME from the ELF file; the host's link pointing at the
    file names the same SONAME on an ldconfig'd node, and works on the tests' fake files)."""
    links: list[str] = []
    for library in files.libraries:
        folder, name = os.path.split(library)
        host_dir = Path(files.host(folder))
        if name.startswith("libcuda.so."):
            links.append(f"libcuda.so.1::{folder}/libcuda.so")
        sonames = sorted(p.name for p in host_dir.iterdir() if p.is_symlink() and os.readlink(p) == name)
        for soname in sonames[:1]:
            links.append(f"{name}::{folder}/{soname}")
            so_link = soname.split(".so")[0] + ".so"
            if so_link != soname and (host_dir / so_link).is_symlink():
                links.append(f"{soname}::{folder}/{so_link}")
    return list(dict.fromkeys(links))


def build_spec(files: DriverFiles, hook: str) -> dict:
    """The CDI spec: a device per GPU index (and UUID), "all", and the common edits every device brings."""
    def node(path: str) -> dict:
        return {"path": path} if files.host(path) == path else {"path": path, "hostPath": files.host(path)}

    def mount(path: str, options: list[str]) -> dict:
        return {"hostPath": files.host(path), "containerPath": path, "options": options}

    devices = []
    for index, path in files.gpus.items():
        devices.append({"name": index, "containerEdits": {"deviceNodes": [node(path)]}})
        if index in files.uuids:
            devices.append({"name": files.uuids[index], "containerEdits": {"deviceNodes": [node(path)]}})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [node(p) for p in files.gpus.values()]}})
    library_dirs = list(dict.fromkeys(os.path.dirname(lib) for lib in files.libraries))
    libcuda_dirs = [os.path.dirname(lib) for lib in files.libraries if os.path.basename(lib).startswith("libcuda.so.")]
    hooks = []
    if links := symlinks(files):
        hooks.append({"hookName": "createContainer", "path": hook,
                      "args": [os.path.basename(hook), "create-symlinks",
                               *[arg for link in links for arg in ("--link", link)]]})
    hooks.append({"hookName": "createContainer", "path": hook,
                  "args": [os.path.basename(hook), "update-ldcache",
                           *[arg for folder in library_dirs for arg in ("--folder", folder)]]})
    edits = {
        "env": ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={':'.join(dict.fromkeys(libcuda_dirs))}"],
        "deviceNodes": [node(path) for path in files.control_nodes],
        "mounts": [mount(path, FILE_OPTIONS) for path in (*files.libraries, *files.binaries, *files.firmware)]
                  + [mount(path, IPC_OPTIONS) for path in files.sockets],
        "hooks": hooks,
    }
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices, "containerEdits": edits}


def to_yaml(value: object, indent: int = 0) -> str:
    """Block-style YAML of dicts, lists and strings (scalars as JSON strings, which YAML reads as they are)."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:\n{to_yaml(item, indent + 1)}")
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                nested = to_yaml(item, indent + 1)
                lines.append(f"{pad}- {nested.lstrip()}")
            else:
                lines.append(f"{pad}- {json.dumps(item)}")
        return "\n".join(lines)
    return pad + json.dumps(value)


def write_spec(spec: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("---\n" + to_yaml(spec) + "\n")
    path.chmod(0o644)
    return path


def write_hook_launcher(path: Path, python: str = sys.executable) -> Path:
    """The hook program the spec names: this file's `hook` commands, run by `python`."""
    path.write_text(f"#!{python} -I\nimport sys\nsys.argv[1:1] = ['hook']\nsys.path.insert(0, "
                    f"{str(Path(__file__).resolve().parent)!r})\nimport cdi\nsys.exit(cdi.main())\n")
    path.chmod(0o755)
    return path


def apply(spec: dict, names: list[str], config: dict) -> dict:
    """The spec's edits for the devices `names` applied to an OCI config.json, as the CDI library does for podman
    and containerd (tags.cncf.io/container-device-interface pkg/cdi container-edits.go): device nodes (type and
    numbers read from the host node) with their cgroup rules, mounts, env, hooks by their OCI stage."""
    by_name = {device["name"]: device["containerEdits"] for device in spec["devices"]}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ValueError(f"CDI device {spec['kind']}={unknown[0]} is not in the spec: it has {', '.join(by_name)}")
    edits = [spec.get("containerEdits", {}), *(by_name[name] for name in names)]
    linux = config.setdefault("linux", {})
    for edit in edits:
        for node in edit.get("deviceNodes", []):
            status = os.stat(node.get("hostPath", node["path"]))
            major, minor = os.major(status.st_rdev), os.minor(status.st_rdev)
            linux.setdefault("devices", []).append({"path": node["path"], "type": "c", "major": major,
                                                    "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0})
            linux.setdefault("resources", {}).setdefault("devices", []).append(
                {"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"})
        config.setdefault("mounts", []).extend(
            {"destination": mount["containerPath"], "type": "bind", "source": mount["hostPath"],
             "options": mount.get("options", [])} for mount in edit.get("mounts", []))
        config.setdefault("process", {}).setdefault("env", []).extend(edit.get("env", []))
        for hook in edit.get("hooks", []):
            config.setdefault("hooks", {}).setdefault(hook["hookName"], []).append(
                {key: hook[key] for key in ("path", "args", "env", "timeout") if key in hook})
    return config


# --- the hooks, run by the engine's runtime in the container's mount namespace before pivot_root ---

def container_root(state: dict) -> Path:
    """The container's root from the OCI state on stdin: its bundle's config.json root.path."""
    bundle = Path(state["bundle"])
    root = Path(json.loads((bundle / "config.json").read_text())["root"]["path"])
    return root if root.is_absolute() else bundle / root


def inside(root: Path, path: str) -> Path:
    """`path` of the container under `root`, its parent folders' symlinks resolved inside the root."""
    current = root
    for part in Path(path.lstrip("/")).parent.parts:
        candidate = current / part
        while candidate.is_symlink():
            target = os.readlink(candidate)
            candidate = (root / target.lstrip("/")) if target.startswith("/") else candidate.parent / target
        current = candidate
    return current / Path(path).name


def create_symlinks(root: Path, links: list[str]) -> None:
    for pair in links:
        target, separator, link = pair.partition("::")
        if not separator or not link.startswith("/"):
            raise SystemExit(f"cdi hook: bad --link {pair!r}: expected TARGET::/absolute/link")
        where = inside(root, link)
        if where.is_symlink() and os.readlink(where) == target:
            continue
        where.parent.mkdir(parents=True, exist_ok=True)
        where.symlink_to(target)


def update_ldcache(root: Path, folders: list[str], ldconfig: str) -> None:
    """The folders in /etc/ld.so.conf.d/00-nvcr-gpuckpt.conf (nvidia-ctk's prefix), then the cache rebuilt by the
    host's ldconfig chrooted into the container's root (-r): the image needs no ldconfig of its own."""
    conf_d = inside(root, "/etc/ld.so.conf.d/x").parent
    conf_d.mkdir(parents=True, exist_ok=True)
    (conf_d / "00-nvcr-gpuckpt.conf").write_text("".join(f"{folder}\n" for folder in folders))
    top = inside(root, "/etc/ld.so.conf")
    if not top.exists():
        top.write_text("include /etc/ld.so.conf.d/*.conf\n")
    subprocess.run([ldconfig, "-r", str(root)], check=True, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cdi.py", description=__doc__.split("\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    generate = verbs.add_parser("generate", help="write the node's CDI spec")
    generate.add_argument("--root", default="/", help="the driver's root (a fake tree in tests)")
    generate.add_argument("--output", default="/etc/cdi/nvidia.yaml")
    generate.add_argument("--hook", default="/usr/local/bin/gpuckpt-cdi-hook", help="the hook program the spec names")
    generate.add_argument("--kind", default=KIND)
    hook = verbs.add_parser("hook", help="a hook the spec declares (reads the container's OCI state on stdin)")
    hook_verbs = hook.add_subparsers(dest="hook", required=True)
    links = hook_verbs.add_parser("create-symlinks")
    links.add_argument("--link", action="append", default=[], metavar="TARGET::LINK")
    ldcache = hook_verbs.add_parser("update-ldcache")
    ldcache.add_argument("--folder", action="append", default=[])
    ldcache.add_argument("--ldconfig-path", default="/sbin/ldconfig")
    args = parser.parse_args(argv)
    if args.verb == "generate":
        if not re.fullmatch(r"[a-z0-9.-]+/[a-z0-9_.-]+", args.kind):
            parser.error(f"--kind {args.kind!r}: expected vendor.com/class")
        spec = build_spec(discover(Path(args.root), uuids=node_uuids() if args.root == "/" else None), args.hook)
        spec["kind"] = args.kind
        print(write_spec(spec, Path(args.output)))
        return 0
    root = container_root(json.load(sys.stdin))
    if args.hook == "create-symlinks":
        create_symlinks(root, args.link)
    else:
        update_ldcache(root, args.folder, args.ldconfig_path)
    return 0


def node_uuids() -> dict[str, str]:
    """nvidia-smi's index -> UUID, for the devices named by UUID beside their index (nvidia-ctk's default)."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return dict((part.strip() for part in line.split(",", 1)) for line in listed.strip().splitlines())


if __name__ == "__main__":
    sys.exit(main())
