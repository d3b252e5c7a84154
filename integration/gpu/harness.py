"""GPU test bed on the lent machine: install the carried tools, build GPU bundles, drive them.

Used by the pytest scenarios (conftest.py, test_*.py: `pytest -m gpu integration/gpu`) and the
benchmarks beside them (bench_engine.py, cold_vs_restore.py...), which run as root on the GPU
machine from the repository root (conftest.py's docstring says how).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CARRY = REPO / ".carry"
SITE = Path("/tmp/gpuckpt-site")
TORCH_PYTHON = "/opt/torch/.venv/bin/python3"
RUNTIME = "/usr/local/bin/gpuckpt-runtime"
CLI = "/usr/local/bin/gpuckpt"
HOOK = "/usr/local/bin/gpuckpt-hook"
GPUCKPTD = "/usr/local/bin/gpuckptd"
RUNTIMED = "/usr/local/bin/gpuckpt-runtimed"
RUNTIME_ROOT = "/run/gpuckpt-gpu"
WORK = Path("/tmp/gpuckpt-gpu")
GPU_DIR = REPO / "integration" / "gpu"
OUT: Path | None = None  # where CRIU's logs of a failed checkpoint/restore are kept (set by the runner)
MACHINE_TAG = "gpu"  # the machine in the names of the files written to OUT (conftest.py sets it: "h100", "h200x2")
COUNTER = ["python3", "/work/gpu_counter.py"]  # the counter workload, as a bundle sees integration/gpu (/work)
# How the GPU reaches a container: "binds" (device nodes, the host's /usr, /usr/local/nvidia and /opt/torch bound
# into a bare rootfs) or "cdi" (the self-contained image of image.py, the driver brought by the node's CDI spec
# alone, cdi.py: `--device nvidia.com/gpu=N` for the engines, the spec's edits applied to runc bundles). Set by
# $GPUCKPT_GPU_INJECT or conftest.py's --inject.
INJECT = os.environ.get("GPUCKPT_GPU_INJECT", "binds")
INJECT_MODES = ("binds", "cdi")
CDI_SPEC = Path("/etc/cdi/nvidia.yaml")
CDI_HOOK = Path("/usr/local/bin/gpuckpt-cdi-hook")
IMAGE_ROOT = Path("/var/tmp/gpuckpt-gpu-image")  # image.py's root: the engines' image and the bundles' lower layer
# whether that image holds Triton and gcc: only when a selected scenario is marked torch_compile (conftest.py)
IMAGE_COMPILE = False
NCCL_SAFE = {"NCCL_P2P_DISABLE": "1", "NCCL_CUMEM_ENABLE": "0"}
# torch.distributed's TCPStore server runs on libuv, whose io_uring CRIU cannot dump (torch's
# libuv ignored UV_USE_IO_URING=0 on 2x H200); USE_LIBUV=0 takes TCPStore's plain backend.
NCCL_KEEP = {"NCCL_SOCKET_IFNAME": "lo", "USE_LIBUV": "0"} | {
    key: os.environ[key]
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
    if key in os.environ
}


def sh(*argv: str, check: bool = True, timeout: float = 900, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def unpack_carry(pack: Path = REPO / ".carry.tar.xz", into: Path = CARRY) -> None:
    """integration/gpu/pack-carry.sh's .carry.tar.xz into .carry, unless this very pack is
    unpacked there already (a warm machine keeps .carry between calls, maybe from another pack)."""
    if not pack.exists():
        return
    stamp, unpacked = into / ".pack", f"{pack.stat().st_size} {pack.stat().st_mtime_ns}"
    if stamp.exists() and stamp.read_text() == unpacked:
        return
    shutil.rmtree(into, ignore_errors=True)
    with tarfile.open(pack) as tar:
        tar.extractall(into, filter="tar")
    stamp.write_text(unpacked)


DOCKER28_CARRY = REPO / ".carry-docker28"  # docker 28's pack of its own (pack-carry.sh docker28): kept on a warm
# machine between calls, since docker 28 and the base pack do not fit in one call's 64 MiB together


def unpack_docker28() -> None:
    """pack-carry.sh docker28's .carry-docker28.tar.xz into .carry-docker28, unless unpacked there already."""
    unpack_carry(REPO / ".carry-docker28.tar.xz", DOCKER28_CARRY)


def install() -> dict:
    """Put the carried runc/CRIU first on PATH, gpuckpt and its wheels on a private path, the launcher."""
    unpack_carry()
    os.environ["PATH"] = f"{CARRY / 'bin'}:{os.environ['PATH']}"
    SITE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(str(path) for path in (CARRY / "wheels").glob("*.whl"))
    if wheels:
        sh(TORCH_PYTHON, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--target", str(SITE), "--upgrade", *wheels)
    pycriu, system_pycriu = CARRY / "pycriu", Path("/usr/lib/python3/dist-packages/pycriu")
    if pycriu.is_dir() and not system_pycriu.exists():  # where a distribution's python3-pycriu lives
        shutil.copytree(pycriu, system_pycriu)
        sh("chmod", "-R", "go-w", str(system_pycriu))
    link = SITE / "gpuckpt"
    if not link.exists():
        link.symlink_to(REPO)
    torch_site = sh(TORCH_PYTHON, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    for launcher, module in ((RUNTIME, "gpuckpt.shim.main"), (CLI, "gpuckpt.cli.main"), (HOOK, "gpuckpt.hooks.main"),
                             (GPUCKPTD, "gpuckpt.service.main"), (RUNTIMED, "gpuckpt.shim.resident.server")):
        Path(launcher).write_text(
            f"#!{TORCH_PYTHON} -IS\nimport sys\nsys.path[:0] = [{str(SITE)!r}, {torch_site!r}]\n"
            f"from {module} import main\nsys.exit(main())\n")
        os.chmod(launcher, 0o755)
    compiled = CARRY / "bin" / "gpuckpt-runtime-compiled"  # built by pack-carry.sh for these paths
    if compiled.exists():  # its Python fallback sees SITE alone: every module the shim loads is there
        shutil.copy(compiled, RUNTIME)
    Path("/etc/gpuckpt").mkdir(exist_ok=True)
    runc = shutil.which("runc")
    Path("/etc/gpuckpt/config.toml").write_text(f'delegate = "{runc}"\n')
    os.chmod("/etc/gpuckpt/config.toml", 0o644)
    sh(CLI, "trust", "init")  # the node key: the shim signs each dump with it and verifies it at restore
    facts = {
        "runc": sh("runc", "--version").stdout.splitlines()[0],
        "criu": sh("criu", "--version").stdout.strip().splitlines()[0],
        "criu_check": sh("criu", "check", check=False).stdout.strip()[-200:] or "(see stderr)",
        "gpuckpt_runtime": sh(RUNTIME, "--version").stdout.splitlines()[0],
        "gpuckpt_runtime_launcher": "compiled" if compiled.exists() else "python",
        "nvidia_smi": sh(
            "nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"
        ).stdout.strip(),
        "thp": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip(),
    }
    if INJECT == "cdi":
        facts["cdi"] = install_cdi()
    log(f"installed: {json.dumps(facts)}")
    return facts


def install_cdi() -> dict:
    """CDI mode's node: the hook program, the CDI spec from this node's driver files (as `nvidia-ctk cdi generate`
    would write it), the self-contained image's root (kept on a warm machine)."""
    import cdi
    import image

    cdi.write_hook_launcher(CDI_HOOK, TORCH_PYTHON)
    spec = cdi_spec()
    cdi.write_spec(spec, CDI_SPEC)
    started = time.monotonic()
    built = image.build(IMAGE_ROOT, TORCH_PYTHON, IMAGE_COMPILE)
    return {"spec": str(CDI_SPEC), "driver_version": cdi.driver_version(),
            "devices": [device["name"] for device in spec["devices"]],
            "mounts": [m["containerPath"] for m in spec["containerEdits"]["mounts"]],
            "image_bytes": built["bytes"], "image_build_s": round(time.monotonic() - started, 1),
            "image_compile": built["compile"], "image_distributions": built["distributions"],
            "toolchain_packages": built["toolchain_packages"]}


def cdi_spec() -> dict:
    """This node's CDI spec (the one install_cdi() writes), as a dict."""
    import cdi

    return cdi.build_spec(cdi.discover(uuids=cdi.node_uuids()), str(CDI_HOOK))


def gpus() -> list[dict]:
    """The machine's GPUs as nvidia-smi names them: index, name, driver, memory, UUID."""
    fields = ("index", "name", "driver_version", "memory_total_mib", "uuid")
    listed = sh("nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,uuid",
                "--format=csv,noheader,nounits").stdout
    return [dict(zip(fields, (part.strip() for part in line.split(",")))) for line in listed.strip().splitlines()]


def machine_tag(found: list[dict]) -> str:
    """The machine as the results' file names give it: "h100", "h200x2" (the GPU model, the count past one)."""
    words = found[0]["name"].split() if found else ["gpu"]
    model = next((word for word in words if word[:1].isalpha() and word[1:].isdigit()), "-".join(words[1:2]) or "gpu")
    return model.lower() + (f"x{len(found)}" if len(found) > 1 else "")


def result_path(name: str, suffix: str = ".json") -> Path:
    """OUT/NAME-MACHINE.json: a figure file a scenario writes beside its result, the machine in its name."""
    assert OUT is not None, "OUT is set by conftest.py's gpu_run fixture"
    return OUT / f"{name}-{MACHINE_TAG}{suffix}"


def gpu_count() -> int:
    return len(sh("nvidia-smi", "-L").stdout.strip().splitlines())


def timed(call) -> float:
    """Seconds `call()` took, rounded as the results give them."""
    started = time.monotonic()
    call()
    return round(time.monotonic() - started, 2)


class Gpuckptd:
    """The node service as a process (no systemd on the GPU machine), its log in WORK/LOG_NAME."""

    def __init__(self, env: dict[str, str], log_name: str = "gpuckptd.log") -> None:
        self.env, self.log = env, WORK / log_name
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 600) -> None:  # a restore at start comes before READY
        earlier = self.log.stat().st_size if self.log.exists() else 0
        self.process = subprocess.Popen([GPUCKPTD], env=self.env, stderr=open(self.log, "ab"))
        deadline = time.monotonic() + timeout_s
        while "ready on" not in self.log.read_bytes()[earlier:].decode(errors="replace"):
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()[-2000:]
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=600)


def gpu_memory_used_mib() -> int:
    return int(sh("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout.split()[0])


def gpuckpt_python(code: str) -> object:
    """What `code` prints as JSON, run by the interpreter gpuckpt was installed for (its wheels on SITE)."""
    return json.loads(sh(TORCH_PYTHON, "-c", code, env=dict(os.environ, PYTHONPATH=str(SITE))).stdout)


def install_hooks_d() -> None:
    """gpuckpt-hook's hooks.d files, as `gpuckpt install --engine podman` writes them."""
    hooks_dir = Path("/etc/containers/oci/hooks.d")
    hooks_dir.mkdir(parents=True, exist_ok=True)
    files = gpuckpt_python(f"import json; from gpuckpt.node.hooks_d import hooks_d_files; "
                           f"print(json.dumps(hooks_d_files({HOOK!r})))")
    for file_name, text in files.items():  # type: ignore[attr-defined]
        (hooks_dir / file_name).write_text(text)


def machine_floors() -> dict:
    """The machine and the floors under the phases on it, measured once the workload has left the GPU: the
    bus for the device phases, the disk under /var/tmp (where the images and archives go) for the write."""
    return {"machine": sh("nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader").stdout.strip(),
            "copy_floor": copy_floor(), "disk_floor": disk_floor(Path("/var/tmp"))}


def disk_floor(directory: Path, gib: int = 2) -> dict:
    """Sequential write (flushed) and cold read of `gib` GiB where podman keeps checkpoints: the disk's floor."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / "gpuckpt-disk-probe"
    block = os.urandom(1 << 20) * 16
    try:
        started = time.monotonic()
        with open(probe, "wb") as sink:
            for _ in range(gib * 64):
                sink.write(block)
            os.fsync(sink.fileno())
        write_s = time.monotonic() - started
        drop_caches()
        started = time.monotonic()
        with open(probe, "rb", buffering=0) as source:
            while source.read(16 << 20):
                pass
        read_s = time.monotonic() - started
    finally:
        probe.unlink(missing_ok=True)
    return {"where": str(directory), "write_gb_s": round(gib * 2**30 / write_s / 1e9, 2),
            "cold_read_gb_s": round(gib * 2**30 / read_s / 1e9, 2)}


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _device_rule(path: str) -> dict:
    status = os.stat(path)
    return {"path": path, "type": "c", "major": os.major(status.st_rdev), "minor": os.minor(status.st_rdev),
            "fileMode": 0o666, "uid": 0, "gid": 0}


def nvidia_devices(gpu_minors: list[int]) -> list[dict]:
    paths = [f"/dev/nvidia{minor}" for minor in gpu_minors]
    paths += [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") if os.path.exists(p)]
    return [_device_rule(path) for path in paths]


def make_netns(name: str) -> None:
    """A named network namespace with its loopback up (pyroute2, carried: no iproute2 there)."""
    if str(SITE) not in sys.path:
        sys.path.insert(0, str(SITE))
    from pyroute2 import IPRoute, netns  # from install()'s SITE: the machine has no pyroute2 of its own

    netns.create(name)
    with IPRoute(netns=name) as ip:
        ip.link("set", index=ip.link_lookup(ifname="lo")[0], state="up")


class Bundle:
    """An OCI bundle whose rootfs borrows the host's userland (torch, the driver) read-only."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], gpu_minors: list[int] = [0],
                 own_network: bool = False, annotations: dict[str, str] | None = None) -> None:
        self.name = f"gpu-{name}-{os.getpid()}"
        self.dir = WORK / self.name
        self.last_messages = ""
        self.rootfs = self.dir / "rootfs"
        if self.dir.exists():
            sh("umount", str(self.rootfs), check=False)
            shutil.rmtree(self.dir)
        if INJECT == "cdi":  # the image's root as the lower layer of an overlay, as the engines mount an image
            for sub in ("rootfs", "upper", "overlay-work"):
                (self.dir / sub).mkdir(parents=True)
            sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={IMAGE_ROOT},upperdir={self.dir / 'upper'},"
               f"workdir={self.dir / 'overlay-work'}", str(self.rootfs))
        else:
            for sub in ("usr", "opt/torch", "etc", "proc", "dev", "sys", "tmp", "work", "root"):
                (self.rootfs / sub).mkdir(parents=True, exist_ok=True)
            # Ubuntu's /lib, /bin... are links into /usr: CRIU restores links, not bind mounts of them.
            for link in ("lib", "lib64", "bin", "sbin"):
                target = os.readlink(f"/{link}") if os.path.islink(f"/{link}") else f"usr/{link}"
                (self.rootfs / link).symlink_to(target)
        sh(RUNTIME, "spec", cwd=self.dir)
        spec = json.loads((self.dir / "config.json").read_text())
        spec["root"] = {"path": str(self.rootfs), "readonly": False}
        process = spec["process"]
        process["terminal"] = False
        process["args"] = args
        process["cwd"] = "/work"
        process["env"] = [f"{k}={v}" for k, v in {**container_env(), **env}.items()]
        for mount in spec["mounts"]:
            if mount["destination"] == "/dev/shm":  # NCCL's SHM transport needs more than 64 MiB
                mount["options"] = [o for o in mount["options"] if not o.startswith("size=")] + ["size=4g"]
        userland = [
            {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["bind", "ro"]},
            # its own mount: through a recursive bind of /usr, CRIU refuses to dump it (LAB)
            {
                "destination": "/usr/local/nvidia",
                "type": "bind",
                "source": "/usr/local/nvidia",
                "options": ["bind", "ro"],
            },
            {"destination": "/opt/torch", "type": "bind", "source": "/opt/torch", "options": ["rbind", "ro"]},
            {"destination": "/etc", "type": "bind", "source": "/etc", "options": ["bind", "ro"]},
        ]
        spec["mounts"] += [*(userland if INJECT == "binds" else []),
                           {"destination": "/work", "type": "bind", "source": str(GPU_DIR), "options": ["bind", "ro"]}]
        linux = spec["linux"]
        # Host network unless asked: no network namespace, so CRIU needs no network lock (no
        # iptables here). With its own, loopback TCP inside it is dumped with --tcp-established.
        # That namespace is made here and joined by path, as podman and Kubernetes do: runc 1.1
        # brings up the loopback of a namespace it creates only after CRIU has reconnected the
        # sockets ("Network is unreachable").
        self.netns = f"/run/netns/{self.name}" if own_network else None
        linux["namespaces"] = [ns for ns in linux["namespaces"] if ns["type"] != "network"]
        if self.netns:
            make_netns(self.name)
            linux["namespaces"].append({"type": "network", "path": self.netns})
        linux.setdefault("resources", {})["devices"] = [{"allow": True, "access": "rwm"}]
        if INJECT == "cdi":  # what a CDI-aware engine does with `nvidia.com/gpu=N` (containerd's CRI, podman)
            import cdi

            cdi.apply(cdi_spec(), [str(minor) for minor in gpu_minors], spec)
        else:
            linux["devices"] = nvidia_devices(gpu_minors)
        if annotations:  # e.g. org.criu.config, which runc hands to CRIU (bench_engine.py's peer)
            spec["annotations"] = {**spec.get("annotations", {}), **annotations}
        (self.dir / "config.json").write_text(json.dumps(spec, indent=1))

    def runtime(self, *argv: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        """Call the shim for this bundle. stdio is /dev/null: a detached container inherits it, and
        CRIU cannot dump our pipes; the runtime's own messages come back through its --log file."""
        log = self.dir / "runtime.log"
        log.write_text("")
        with open(os.devnull, "r+b") as null:
            result = subprocess.run([RUNTIME, "--root", RUNTIME_ROOT, "--log", str(log), *argv], stdin=null,
                                    stdout=null, stderr=null, cwd=self.dir, timeout=timeout)
        messages = log.read_text()
        if check and result.returncode != 0:
            raise RuntimeError(f"gpuckpt-runtime {' '.join(argv[:3])} exited {result.returncode}: {messages[-3000:]}")
        return subprocess.CompletedProcess(result.args, result.returncode, "", messages)

    def start(self) -> None:
        self.runtime("run", "-d", "--pid-file", str(self.dir / "pid"), self.name)

    def checkpoint(self, image_dir: Path, *extra: str, check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
        started = time.monotonic()
        with self.keeping_logs(image_dir):
            result = self.runtime("checkpoint", "--image-path", str(image_dir), *extra, self.name, check=check)
        return time.monotonic() - started, result

    def restore(self, image_dir: Path, *extra: str) -> float:
        started = time.monotonic()
        with self.keeping_logs(image_dir):
            self.last_messages = self.runtime(
                "restore",
                "-d",
                *extra,
                "--bundle",
                str(self.dir),
                "--image-path",
                str(image_dir),
                "--pid-file",
                str(self.dir / "restored.pid"),
                self.name,
            ).stderr
        return time.monotonic() - started

    @contextlib.contextmanager
    def keeping_logs(self, image_dir: Path):
        """On failure, copy CRIU's logs (runc writes them into the image directory) to OUT."""
        try:
            yield
        except Exception:
            if OUT is not None:
                for criu_log in image_dir.glob("*.log"):
                    shutil.copy(criu_log, OUT / f"{self.name}-{criu_log.name}")
            raise

    def state(self) -> dict:
        return json.loads(sh(RUNTIME, "--root", RUNTIME_ROOT, "state", self.name).stdout)

    def read(self, name: str) -> str:
        try:
            return (self.rootfs / "tmp" / name).read_text()
        except FileNotFoundError:
            return ""

    def renew_netns(self) -> None:
        """A fresh network namespace at the same path for the restore, as podman makes one: the old
        one keeps the checkpointed job's TIME_WAIT sockets (CRIU then cannot bind NCCL's listening
        ports again: "Address already in use") and CRIU's network-lock table."""
        from pyroute2 import netns
        netns.remove(self.name)
        make_netns(self.name)

    def destroy(self) -> None:
        sh(RUNTIME, "--root", RUNTIME_ROOT, "delete", "--force", self.name, check=False)
        if INJECT == "cdi" and sh("umount", str(self.rootfs), check=False).returncode != 0:
            sh("umount", "--lazy", str(self.rootfs), check=False)  # a runtime that failed may hold it a while
        if self.netns:
            from pyroute2 import netns
            netns.remove(self.name)


class StateDir:
    """The directory an engine's container writes its counters to (bound at /state), read the
    way a Bundle's rootfs /tmp is, for wait_counters and assert_continues."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name, self.directory = name, directory
        directory.mkdir(parents=True, exist_ok=True)

    def read(self, name: str) -> str:
        try:
            return (self.directory / name).read_text()
        except FileNotFoundError:
            return ""


DRIVER_STATES = """
import sys
from gpuckpt.cuda.node import NodeGpus
driver = NodeGpus().load_driver()
driver.init()
for pid in sys.argv[1:]:
    try:
        print(driver.state(int(pid)).name)
    except Exception as error:
        print(f"{type(error).__name__}: {error}")
"""


def _read_or_none(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # the task or descriptor went meanwhile
        return None


def process_tree(init_pid: int) -> list[dict]:
    """Every process of a container (its init and all below it): PID, parent, start time, threads' names,
    and what it holds of /dev/nvidia* (descriptors, mappings). A task ending meanwhile is skipped alone."""
    found, pending = [], [init_pid]
    while pending:
        pid = pending.pop()
        proc = Path(f"/proc/{pid}")
        stat = _read_or_none(proc / "stat")
        if stat is None:
            continue
        fields = stat.rpartition(")")[2].split()
        tasks = list((proc / "task").iterdir()) if (proc / "task").is_dir() else []
        pending.extend(int(child) for task in tasks for child in (_read_or_none(task / "children") or "").split())
        nvidia_fds = 0
        for entry in (proc / "fd").iterdir() if (proc / "fd").is_dir() else []:
            try:
                nvidia_fds += os.readlink(entry).startswith("/dev/nvidia")
            except OSError:
                pass
        mappings = [" ".join(line.split()[:2]) for line in (_read_or_none(proc / "maps") or "").splitlines()
                    if " /dev/nvidia" in line]
        found.append({"pid": pid, "ppid": int(fields[1]), "start": int(fields[19]), "nvidia_fds": nvidia_fds,
                      "nvidia_mappings": len(mappings), "first_mappings": mappings[:4],
                      "threads": sorted({(_read_or_none(task / "comm") or "").strip() for task in tasks})[:12]})
    return found


def driver_holders(init_pid: int) -> list[dict]:
    """The processes of a container that hold /dev/nvidia* (process_tree), with what the driver's checkpoint
    API says of each (gpuckpt's binding, as the shim calls it)."""
    found = [process for process in process_tree(init_pid) if process["nvidia_fds"] or process["nvidia_mappings"]]
    states = sh("python3", "-c", DRIVER_STATES, *(str(holder["pid"]) for holder in found),
                env=dict(os.environ, PYTHONPATH=str(SITE)), check=False)
    for holder, state in zip(found, states.stdout.splitlines()):
        holder["driver_state"] = state
    return found


class TreeWatch:
    """process_tree() of a container every `every_s` on a thread, while a step runs: each change of a
    process's hold on the driver (or a new process) with the seconds since start."""

    def __init__(self, init_pid: int, every_s: float = 0.1) -> None:
        self.init_pid, self.every_s = init_pid, every_s
        self.changes: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "TreeWatch":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        seen: dict[tuple[int, int], tuple[int, int]] = {}
        while not self._stop.is_set():
            for process in process_tree(self.init_pid):
                key, hold = (process["pid"], process["start"]), (process["nvidia_fds"], process["nvidia_mappings"])
                if seen.get(key) != hold:
                    seen[key] = hold
                    self.changes.append({"at_s": round(time.monotonic() - self._started, 2), **process})
            self._stop.wait(self.every_s)


def copy_floor(gib: float = 2) -> dict:
    """This machine's host<->device copy rates (pcie_floor.py, in the torch interpreter): the floor under the
    driver's checkpoint and restore phases."""
    return json.loads(sh(TORCH_PYTHON, str(GPU_DIR / "pcie_floor.py"), f"{gib:g}", timeout=300).stdout)


def helper_listens() -> bool:
    """gpuckpt-runtimed (the resident helper) answers on its socket."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect("/run/gpuckpt/runtime.sock")
        return True
    except OSError:
        return False
    finally:
        probe.close()


@contextlib.contextmanager
def resident_helper(journal_path: Path) -> Iterator[None]:
    """gpuckpt-runtimed running, as systemd's socket starts it on an installed node (no systemd here), its
    journal appended to `journal_path`."""
    with open(journal_path, "a") as journal:
        helper = subprocess.Popen([RUNTIMED], stderr=journal)
    try:
        deadline = time.monotonic() + 60
        while not helper_listens():
            assert helper.poll() is None and time.monotonic() < deadline, "gpuckpt-runtimed did not listen"
            time.sleep(0.1)
        yield
    finally:
        helper.terminate()
        helper.wait()


@contextlib.contextmanager
def nftables_network_lock() -> Iterator[None]:
    """The operator's `criu.network_lock = "nftables"` for the block: an engine gives even a
    --network none container a network namespace, which CRIU locks while it dumps, and this
    machine has no iptables."""
    config = Path("/etc/gpuckpt/config.toml")
    plain = config.read_text()
    config.write_text(plain + '[criu]\nnetwork_lock = "nftables"\n')
    try:
        yield
    finally:
        config.write_text(plain)


def descendants_of(bundle: Bundle) -> list[int]:
    """The container's init and every process below it."""
    found, pending = [], [int(bundle.state()["pid"])]
    while pending:
        pid = pending.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").iterdir():
            pending.extend(int(child) for child in (task / "children").read_text().split())
    return found


def counter_states(bundle: Bundle, procs: int) -> list[tuple[str, int, str]]:
    states = []
    for rank in range(procs):
        fields = bundle.read(f"state.{rank}").split()
        if len(fields) != 3:
            return []
        states.append((fields[0], int(fields[1]), fields[2]))
    return states


def wait_counters(bundle: Bundle, procs: int, minimum: int, timeout_s: float = 300) -> list[tuple[str, int, str]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = counter_states(bundle, procs)
        if states and all(count >= minimum for _, count, _ in states):
            bad = [s for s in states if s[2] != "ok"]
            if bad:
                raise AssertionError(f"GPU data corrupted: {bad}")
            return states
        time.sleep(0.2)
    raise AssertionError(f"{bundle.name}: counters did not reach {minimum} in {timeout_s} s: "
                         f"{counter_states(bundle, procs)}")


def assert_continues(bundle: Bundle, before: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    after = wait_counters(bundle, len(before), max(count for _, count, _ in before) + 3)
    for (token_before, count_before, _), (token_after, count_after, verdict) in zip(before, after):
        assert token_after == token_before, f"process restarted, not restored: {token_before} -> {token_after}"
        assert count_after > count_before and verdict == "ok"
    return after


def manifest(image_dir: Path) -> dict:
    return json.loads((image_dir / "gpuckpt-manifest.json").read_text())


def image_bytes(image_dir: Path) -> int:
    return sum(path.stat().st_size for path in image_dir.rglob("*") if path.is_file())


def gpu_container(podman: Podman, name: str, env: dict[str, str], *annotations: str) -> StateDir:
    """The counter on GPU 0 in a podman container recorded by the hook (io.gpuckpt.inventory), its state in WORK."""
    state = StateDir(name, WORK / f"{name}-state")
    flags = [arg for annotation in ("io.gpuckpt.inventory=true", *annotations) for arg in ("--annotation", annotation)]
    podman.cli("run", "-d", "--name", name, *podman.RUN_FLAGS, *flags,
               *gpu_run_args(COUNTER, {"STATE": "/state/state", **env}, state.directory, podman.IMAGE))
    return state


class Engine:
    """What docker and podman share here: a tiny image whose userland comes from the host, and
    a GPU container run from it through gpuckpt-runtime."""

    IMAGE = ""
    RUN_FLAGS: tuple[str, ...] = ()

    def cli(self, *argv: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        raise NotImplementedError

    def import_rootfs(self) -> dict:
        """The engine's GPU image: the bare rootfs (binds), or the self-contained image (cdi); how it went."""
        if INJECT == "cdi":
            import image

            return image.podman_import([self.podman], IMAGE_ROOT, self.IMAGE,  # type: ignore[attr-defined]
                                       env=self.env)  # type: ignore[attr-defined]
        self.cli("import", str(rootfs_tar()), self.IMAGE)
        return {}

    def run_gpu(self, name: str, args: list[str], env: dict[str, str], state: StateDir) -> None:
        self.cli("run", "-d", "--name", name, *self.RUN_FLAGS, *gpu_run_args(args, env, state.directory, self.IMAGE))


class Docker(Engine):
    """The carried docker engine (dockerd starting its own containerd), gpuckpt-runtime
    registered as in the README, on a socket and data root of its own; no network set-up
    (the GPU machine has no iptables): containers run with --network none."""

    SOCKET = "/run/gpuckpt-docker.sock"
    DATA_ROOT = Path("/var/lib/gpuckpt-docker")
    EXEC_ROOT = Path("/run/gpuckpt-docker")
    IMAGE = "gpuckpt-gpu-rootfs:latest"
    RUN_FLAGS = ("--runtime", "gpuckpt-runtime")
    CARRIED = CARRY / "docker"  # the carry pack's folder (integration/testbed/bundle-docker.sh)
    SETTINGS: dict = {}  # daemon.json settings of this engine's own

    def __init__(self) -> None:
        self.bin = self.CARRIED / "bin"
        if not (self.bin / "dockerd").exists():
            raise RuntimeError(f"no docker engine in {self.bin}: run integration/gpu/pack-carry.sh before the call")
        self.env = dict(os.environ, PATH=f"{self.bin}:{CARRY / 'bin'}:{os.environ['PATH']}")
        self.daemon: subprocess.Popen | None = None
        self.log = WORK / "dockerd.log"

    def cli(self, *argv: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        return sh(str(self.bin / "docker"), "-H", f"unix://{self.SOCKET}", *argv, check=check, timeout=timeout,
                  env=self.env)

    def start(self) -> str:
        """Start dockerd (overlay2, else vfs); the storage driver in use."""
        WORK.mkdir(parents=True, exist_ok=True)
        env = dict(self.env)
        if not any(
            Path(d, "libdevmapper.so.1.02.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu")
        ):
            env["LD_LIBRARY_PATH"] = str(CARRY / "docker" / "lib")
        for driver in ("overlay2", "vfs"):
            config = {"experimental": True, "iptables": False, "ip-forward": False, "ip-masq": False,
                      "bridge": "none", "storage-driver": driver, "data-root": str(self.DATA_ROOT),
                      "exec-root": str(self.EXEC_ROOT), "pidfile": str(self.EXEC_ROOT / "docker.pid"),
                      "hosts": [f"unix://{self.SOCKET}"], "runtimes": {"gpuckpt-runtime": {"path": RUNTIME}},
                      **self.SETTINGS}
            config_path = WORK / "daemon.json"
            config_path.write_text(json.dumps(config))
            with open(self.log, "a") as daemon_log:
                self.daemon = subprocess.Popen([str(self.bin / "dockerd"), "--config-file", str(config_path)],
                                               stdin=subprocess.DEVNULL, stdout=daemon_log, stderr=daemon_log,
                                               env=env, start_new_session=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.daemon.poll() is None:
                if self.cli("info", check=False, timeout=30).returncode == 0:
                    log(f"dockerd running ({driver}): "
                        f"{self.cli('version', '--format', '{{.Server.Version}}').stdout.strip()}")
                    return driver
                time.sleep(0.5)
            self.stop()
            log(f"dockerd did not start with {driver}: {self.log.read_text()[-1500:]}")
        raise RuntimeError(f"dockerd did not start; its log: {self.log}")

    def stop(self) -> None:
        if self.daemon and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(60)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
        self.daemon = None

    def keep_logs(self, container_id: str) -> None:
        """CRIU's and the runtime's logs of the container's task (containerd's bundle) to OUT."""
        if OUT is not None:
            for path in self.EXEC_ROOT.rglob("*.log*"):
                if container_id in str(path):
                    shutil.copy(path, OUT / f"docker-{container_id[:12]}-{path.name}")

    def runtime_log(self, container_id: str) -> str:
        """What gpuckpt-runtime logged for the container (containerd's task bundle keeps it)."""
        return "".join(path.read_text(errors="replace") for path in self.EXEC_ROOT.rglob("log.json")
                       if container_id in str(path))


class Docker28(Docker):
    """Debian forky's docker 28.5 with its containerd 2.1 (pack-carry.sh docker28), beside the carried 20.10 on a
    socket, data root and exec root of its own; CDI devices (`--device nvidia.com/gpu=N`, the spec in /etc/cdi that
    install_cdi() writes) and the self-contained image. docker 28 restores no container whose network namespace
    it sets up (--network none, bridge: containerd#12141, docs/node.md), so its GPU containers run on the host's
    network."""

    SOCKET = "/run/gpuckpt-docker28.sock"
    DATA_ROOT = Path("/var/lib/gpuckpt-docker28")
    EXEC_ROOT = Path("/run/gpuckpt-docker28")
    IMAGE = "gpuckpt-gpu-cdi:latest"
    CARRIED = DOCKER28_CARRY / "docker28"
    # userland-proxy off: no docker-proxy is carried (no published ports, no bridge)
    SETTINGS = {"features": {"cdi": True}, "cdi-spec-dirs": [str(CDI_SPEC.parent)], "userland-proxy": False}

    def import_rootfs(self) -> dict:
        """The self-contained image, imported through docker (its inspect names labels differently from podman's,
        so image.py finds none and imports each call: the data root is new on each machine anyway)."""
        import image

        return image.podman_import([str(self.bin / "docker"), "-H", f"unix://{self.SOCKET}"], IMAGE_ROOT, self.IMAGE,
                                   env=self.env)

    def run_gpu(self, name: str, args: list[str], env: dict[str, str], state: StateDir) -> None:
        run_args = gpu_run_args(args, env, state.directory, self.IMAGE)
        at = run_args.index("--network")
        run_args[at + 1] = "host"
        self.cli("run", "-d", "--name", name, *self.RUN_FLAGS, *run_args)


def rootfs_tar() -> Path:
    """A tiny image (as a tar for `docker import`/`podman import`) whose userland comes from the
    host by bind mounts, as the bundles' does: Ubuntu's /lib, /bin... links into /usr, the loader
    cache, the user database."""
    path = WORK / "engine-rootfs.tar"
    WORK.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode="w") as tar:
        def add(name: str, kind: bytes = tarfile.DIRTYPE, target: str = "", data: bytes = b"") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, target, len(data)
            info.mode = 0o644 if kind == tarfile.REGTYPE else 0o755
            tar.addfile(info, io.BytesIO(data) if data else None)
        for sub in ("usr", "opt", "opt/torch", "etc", "proc", "dev", "sys", "tmp", "work", "root", "state"):
            add(sub)
        for link in ("lib", "lib64", "bin", "sbin"):
            add(link, tarfile.SYMTYPE, os.readlink(f"/{link}") if os.path.islink(f"/{link}") else f"usr/{link}")
        for name in ("ld.so.cache", "passwd", "group", "nsswitch.conf"):
            if os.path.isfile(f"/etc/{name}"):
                add(f"etc/{name}", tarfile.REGTYPE, data=Path(f"/etc/{name}").read_bytes())
    return path


def container_env() -> dict[str, str]:
    """The workloads' environment: in CDI mode no LD_LIBRARY_PATH (the spec's update-ldcache hook lists the
    driver's folder in the container's ld cache, as nvidia-ctk's does)."""
    base = {"PATH": "/opt/torch/.venv/bin:/usr/bin:/bin", "HOME": "/root", "PYTHONUNBUFFERED": "1"}
    return base if INJECT == "cdi" else {**base, "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}


def gpu_run_args(
    args: list[str], env: dict[str, str], state_dir: Path, image: str, gpu_minors: list[int] = [0]
) -> list[str]:
    """`run` arguments shared by docker and podman: GPU devices, the host userland read-only (binds) or the
    CDI devices and the self-contained image (cdi), STATE written into `state_dir`, no network."""
    env_args = [arg for key, value in {**container_env(), **env}.items() for arg in ("-e", f"{key}={value}")]
    if INJECT == "cdi":
        return ["--network", "none", *[arg for minor in gpu_minors for arg in ("--device", f"nvidia.com/gpu={minor}")],
                "--mount", f"type=bind,source={GPU_DIR},target=/work,readonly",
                "--mount", f"type=bind,source={state_dir},target=/state",
                "-w", "/work", *env_args, image, *args]
    devices = [arg for rule in nvidia_devices(gpu_minors) for arg in ("--device", rule["path"])]
    return ["--network", "none", *devices,
            # /usr/local/nvidia as its own mount, not inside a recursive bind of /usr (LAB)
            "--mount", "type=bind,source=/usr,target=/usr,readonly,bind-nonrecursive=true",
            "--mount", "type=bind,source=/usr/local/nvidia,target=/usr/local/nvidia,readonly",
            "--mount", "type=bind,source=/opt/torch,target=/opt/torch,readonly",
            "--mount", f"type=bind,source={GPU_DIR},target=/work,readonly",
            "--mount", f"type=bind,source={state_dir},target=/state",
            "-w", "/work", *env_args, image, *args]


class Podman(Engine):
    """The carried podman (Debian's, with conmon and the libraries Ubuntu lacks), gpuckpt-runtime
    its runtime as `gpuckpt install --engine podman` sets it, cgroupfs and file events (no systemd
    here), no network backend: containers run with --network none."""

    IMAGE = "localhost/gpuckpt-gpu-rootfs:latest"
    CDI_IMAGE = "localhost/gpuckpt-gpu-cdi:latest"  # image.py's self-contained image
    # podman raises the container's limits (and --ulimit host its own) beyond what this sandbox
    # lets a process raise them to; lowering them is always allowed
    RUN_FLAGS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")

    def __init__(self) -> None:
        if INJECT == "cdi":  # read when the run is configured (conftest.py's --inject), not at import
            self.IMAGE = self.CDI_IMAGE
        carried = CARRY / "podman"
        if not (carried / "bin" / "podman").exists():
            raise RuntimeError(f"no podman in {carried}: run integration/gpu/pack-carry.sh podman before the call")
        wrappers = WORK / "podman-bin"
        wrappers.mkdir(parents=True, exist_ok=True)
        for program in ("podman", "conmon"):  # podman starts conmon with an environment of its own
            (wrappers / program).write_text(f'#!/bin/sh\nLD_LIBRARY_PATH={carried / "lib"} exec '
                                            f'{carried / "bin" / program} "$@"\n')
            os.chmod(wrappers / program, 0o755)
        # gpuckpt export/import find podman on PATH
        self.env = dict(os.environ, PATH=f"{wrappers}:{os.environ['PATH']}")
        self.podman = str(wrappers / "podman")
        conf = Path("/etc/containers")
        conf.mkdir(exist_ok=True)
        (conf / "containers.conf").write_text(
            '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\nruntime = "gpuckpt-runtime"\n'
            f'conmon_path = ["{wrappers / "conmon"}"]\n'
            'runtime_supports_json = ["crun", "runc", "gpuckpt-runtime"]\n'
            # as `gpuckpt install --engine podman` sets it: this podman reads only /usr/share's otherwise
            'hooks_dir = ["/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d"]\n'
            f'[engine.runtimes]\ngpuckpt-runtime = ["{RUNTIME}"]\n')
        (conf / "policy.json").write_text('{"default": [{"type": "insecureAcceptAnything"}]}\n')
        (conf / "storage.conf").write_text('[storage]\ndriver = "overlay"\nrunroot = "/run/containers/storage"\n'
                                           'graphroot = "/var/lib/containers/storage"\n')

    def cli(self, *argv: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        return sh(self.podman, *argv, check=check, timeout=timeout, env=self.env)

