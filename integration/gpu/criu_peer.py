"""The peer column of bench_engine.py's `peer` mode: what users would run instead of gpuckpt.

runc directly (no shim), CRIU 4.2.1 with its CUDA plugin for that container only: runc hands
CRIU the file named by the bundle's `org.criu.config` annotation, whose `libdir` line loads
.carry/criu-plugins/cuda_plugin.so (integration/testbed/build-criu-cuda-plugin.sh). The plugin
runs NVIDIA's `cuda-checkpoint` from PATH (.carry/bin, GPUCKPT_CARRY_PEER=1 pack-carry.sh) once
per process and step: lock (PAUSE_DEVICES), checkpoint (CHECKPOINT_DEVICES), restore and
unlock (RESUME_DEVICES_LATE). Containers without the annotation (the shim's) load no plugin.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from harness import CARRY, RUNTIME_ROOT, WORK, Bundle, sh

PLUGIN_DIR = CARRY / "criu-plugins"
CONFIG = WORK / "criu-peer.conf"
NVIDIA_LIB = "/usr/local/nvidia/lib64"
OP_TIMEOUT_S = 240  # one runc checkpoint or restore; a hung plugin must not eat the device call
LOG_LINE = re.compile(r"^\((\d+\.\d+)\)(.*)$")
# cuda_plugin.c's log lines that open a cuda-checkpoint call; it logs nothing when one succeeds,
# so the call lasts until CRIU's next line
PLUGIN_STEPS = {"pausing devices on pid": "lock_s", "Checkpointing CUDA devices on pid": "device_checkpoint_s",
                "Restore thread pid": "device_restore_unlock_s"}


class PeerError(RuntimeError):
    """The peer column cannot run or failed; the message says which step."""


def peer_env() -> dict[str, str]:
    """runc's environment, which CRIU and cuda-checkpoint inherit: cuda-checkpoint links
    libcuda.so.1, which sits in the driver's own directory on the GPU machine (CRIU's own
    libraries come through its loader's --library-path and ignore LD_LIBRARY_PATH)."""
    env = dict(os.environ)
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    if os.path.exists(f"{NVIDIA_LIB}/libcuda.so.1") and NVIDIA_LIB not in paths:
        env["LD_LIBRARY_PATH"] = ":".join([*paths, NVIDIA_LIB])
    return env


def preflight(criu_version: str) -> dict:
    """Everything the plugin checks before it works, checked here the same way, in seconds: a
    missing piece would otherwise show as a disabled plugin and a failed dump minutes later."""
    plugin = PLUGIN_DIR / "cuda_plugin.so"
    if not plugin.is_file():
        raise PeerError(f"no {plugin}: pack with GPUCKPT_CARRY_PEER=1 integration/gpu/pack-carry.sh")
    built_for = (PLUGIN_DIR / "BUILT-FOR").read_text().strip()
    upstream = criu_version.split()[-1]
    if not built_for.startswith(f"criu {upstream}-"):
        raise PeerError(f"{plugin} was built for {built_for!r}, the criu on PATH is {upstream}")
    tool = shutil.which("cuda-checkpoint")
    if tool != str(CARRY / "bin" / "cuda-checkpoint"):
        raise PeerError(f"cuda-checkpoint on PATH is {tool}, not the carried {CARRY / 'bin'}")
    if not Path("/proc/driver/nvidia/gpus").is_dir():
        raise PeerError("no /proc/driver/nvidia/gpus: the plugin would disable itself")
    if os.environ.get("CRIU_LIBS_DIR") or Path("/etc/criu/runc.conf").exists():
        raise PeerError("CRIU_LIBS_DIR or /etc/criu/runc.conf is set: the shim's containers could load the plugin")
    # the plugin runs `cuda-checkpoint -h`, reads 2047 bytes, wants exit 0 and "--action" (driver r555+)
    helped = subprocess.run([tool, "-h"], capture_output=True, text=True, env=peer_env(), timeout=30)
    help_text = (helped.stdout + helped.stderr)[:2047]
    if helped.returncode != 0 or "--action" not in help_text:
        raise PeerError(f"cuda-checkpoint -h exited {helped.returncode} without --action: {help_text.strip()[-300:]}")
    CONFIG.parent.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(f"libdir {PLUGIN_DIR}\n")
    return {"plugin": built_for, "cuda_checkpoint": tool, "criu_config": CONFIG.read_text().strip(),
            "ld_library_path": peer_env().get("LD_LIBRARY_PATH", "")}


class PeerContainer:
    """One bundle driven by runc alone; CRIU's config file (and so the plugin) by annotation."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.bundle = Bundle(name, args, env, annotations={"org.criu.config": str(CONFIG)})
        self.runc_log = self.bundle.dir / "runc.log"

    def runc(self, *argv: str, check: bool = True) -> None:
        with open(os.devnull, "r+b") as null:  # the container inherits stdio: CRIU cannot dump our pipes
            result = subprocess.run(["runc", "--root", RUNTIME_ROOT, "--log", str(self.runc_log), *argv],
                                    stdin=null, stdout=null, stderr=null, cwd=self.bundle.dir, env=peer_env(),
                                    timeout=OP_TIMEOUT_S)
        if check and result.returncode != 0:
            tail = self.runc_log.read_text(errors="replace")[-1500:] if self.runc_log.exists() else ""
            raise PeerError(f"runc {argv[0]} of {self.bundle.name} exited {result.returncode}: {tail}")

    def start(self) -> None:
        self.runc("run", "-d", "--bundle", str(self.bundle.dir), "--pid-file", str(self.bundle.dir / "pid"),
                  self.bundle.name)

    def checkpoint(self, image_dir: Path) -> float:
        started = time.monotonic()
        self.runc("checkpoint", "--image-path", str(image_dir), self.bundle.name)
        return time.monotonic() - started

    def restore(self, image_dir: Path) -> float:
        started = time.monotonic()
        self.runc("restore", "-d", "--bundle", str(self.bundle.dir), "--image-path", str(image_dir),
                  "--pid-file", str(self.bundle.dir / "restored.pid"), self.bundle.name)
        return time.monotonic() - started

    def destroy(self) -> None:
        self.runc("delete", "--force", self.bundle.name, check=False)


def plugin_phases(image_dir: Path) -> dict:
    """The plugin's cuda-checkpoint calls, summed over processes, from CRIU's logs (runc leaves
    dump.log and restore.log in the image directory): each call runs from the plugin's line until
    CRIU's next one. Raises if the plugin did not handle the GPU: the column would not be the peer."""
    phases: dict[str, float] = {}
    for name in ("dump.log", "restore.log"):
        lines = [(float(m[1]), m[2]) for m in map(LOG_LINE.match, (image_dir / name).read_text(errors="replace")
                                                    .splitlines()) if m]
        for (stamp, text), (next_stamp, _) in zip(lines, lines[1:]):
            for opening, phase in PLUGIN_STEPS.items():
                if f"cuda_plugin: {opening}" in text:
                    phases[phase] = phases.get(phase, 0.0) + next_stamp - stamp
    missing = {"device_checkpoint_s", "device_restore_unlock_s"} - set(phases)
    if missing:
        raise PeerError(f"CRIU's logs in {image_dir} show no cuda_plugin step for {sorted(missing)}: "
                        "the plugin did not move the GPU state")
    return {phase: round(seconds, 3) for phase, seconds in phases.items()}


def assert_no_plugin(image_dir: Path) -> bool:
    """The shim's dump must not have gone through the plugin (it handles the GPU itself); False
    where runc left no dump.log to tell."""
    dump_log = image_dir / "dump.log"
    if not dump_log.exists():
        return False
    if "cuda_plugin" in dump_log.read_text(errors="replace"):
        raise PeerError(f"{dump_log}: CRIU loaded its CUDA plugin for the shim's container")
    return True


def log_tails(image_dir: Path, lines: int = 40) -> dict[str, str]:
    """The end of each CRIU log left in an image directory (runc's own logs are in the error)."""
    tails = {}
    for path in sorted(image_dir.glob("*.log")) if image_dir.is_dir() else []:
        tails[path.name] = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return tails


def gpu_total_bytes() -> int:
    total_mib = sh("nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits").stdout.split()[0]
    return int(total_mib) << 20
