"""The CRI tests' nodes: a private containerd 2.1 (integration/testbed/containerd.sh put Debian forky's in
/opt/gpuckpt/containerd) with its own root, state, socket and config, and the registry its pods pull from.

A node's config is the test bed's (its directories, the sandbox image, no CNI: the pods use the node's
network) with gpuckpt's runtime handler added by `gpuckpt install --engine containerd --config`, as an
operator adds it. The system's containerd 1.6 (docker's) is never touched. A node is started, used and
stopped by a fixture: its pods removed through the CRI, containerd stopped by its PID, what it mounted
below its root and state unmounted, both removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from bed import GPUCKPT, ROOTFS_TAR, RUNTIME, free_port, sh
from cri_client import Kubelet

PREFIX = Path(os.environ.get("GPUCKPT_CONTAINERD_PREFIX", "/opt/gpuckpt/containerd"))
CONTAINERD = PREFIX / "usr" / "bin" / "containerd"
HANDLER = "gpuckpt"  # the runtime handler `gpuckpt install --engine containerd` registers (a RuntimeClass's handler)
IMAGE_NAME = "gpuckpt-cri"
# The pods' image: the test bed's rootfs (python3 for the counter); as a sandbox image it only sleeps.
IMAGE_CMD = ["sleep", "infinity"]
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@contextlib.contextmanager
def loopback_registry(work: Path) -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1, named `localhost:PORT`: containerd pulls from a localhost registry
    over plain HTTP, the CRI's pulls and the restore's pull of the checkpoint's base image alike."""
    port = free_port()
    (work / "registry").mkdir()
    config = work / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {work / 'registry'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    server = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"localhost:{port}"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


def push_base_image(registry: str, work: Path) -> str:
    """The test bed's rootfs tarball as a one-layer OCI image in `registry`; its reference."""
    layout = work / "base-layout"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes | None = None, source: str | None = None) -> tuple[str, int]:
        digest = hashlib.sha256()
        if source is not None:
            with open(source, "rb") as layer:
                while chunk := layer.read(1 << 20):
                    digest.update(chunk)
            shutil.copyfile(source, blobs / digest.hexdigest())
            return f"sha256:{digest.hexdigest()}", os.path.getsize(source)
        assert data is not None
        digest.update(data)
        (blobs / digest.hexdigest()).write_bytes(data)
        return f"sha256:{digest.hexdigest()}", len(data)

    layer_digest, layer_size = blob(source=ROOTFS_TAR)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Cmd": IMAGE_CMD, "Env": [f"PATH={IMAGE_PATH}"]},
              "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}
    config_digest, config_size = blob(json.dumps(config).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                           "size": config_size},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                            "size": layer_size}]}
    manifest_digest, manifest_size = blob(json.dumps(manifest).encode())
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest, "size": manifest_size,
         "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}))
    reference = f"{registry}/{IMAGE_NAME}:latest"
    sh("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:latest", f"docker://{reference}")
    shutil.rmtree(layout)
    return reference


def base_config(root: Path, state: Path, socket_path: Path, sandbox_image: str) -> str:
    """containerd 2.x (config version 3) for one test node: its own directories and sockets, nothing shared
    with the system's containerd, no CNI network (the pods use the node's), NRI off."""
    assert HANDLER == "gpuckpt"
    return f"""version = 3
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket_path}"

[ttrpc]
  address = "{socket_path}.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "{root}/opt"

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{sandbox_image}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = false
  # This machine withholds CAP_SYS_RESOURCE (../shared/LAB.md): a sandbox's oom_score_adj -998 is refused.
  restrict_oom_score_adj = true

# runc's state of this node's containers apart from any other containerd's (/run/containerd/runc/k8s.io);
# `gpuckpt install` adds runtime_type and BinaryName beside it and keeps it.
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpuckpt.options]
  Root = "{state}/runc"

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["{root}/cni-bin"]
  conf_dir = "{root}/cni-conf"
"""


def umount_below(directory: Path) -> None:
    """Unmount everything mounted at or below `directory`, deepest first."""
    prefix = str(directory.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


class Node:
    """One containerd 2.1: started by `start`, driven through `kubelet`, gone after `stop`."""

    def __init__(self, name: str, work: Path, sandbox_image: str) -> None:
        self.name = name
        self.root = Path("/var/lib/gpuckpt-cri") / f"{name}-{os.getpid()}"
        self.state = Path("/run/gpuckpt-cri") / f"{name}-{os.getpid()}"
        self.socket = self.state / "containerd.sock"
        self.config = work / f"{name}-config.toml"
        self.log = work / f"{name}-containerd.log"
        self.config.write_text(base_config(self.root, self.state, self.socket, sandbox_image))
        # gpuckpt-runtime's own config for this node's containers (containerd's environment reaches the shim and
        # the runtime it runs), apart from /etc/gpuckpt/config.toml, which other tests rewrite as they run.
        self.gpuckpt_config = work / f"{name}-gpuckpt.toml"
        self.gpuckpt_config.write_text('delegate = "runc"\n')
        self.cgroup_parent = f"/gpuckpt-cri-{name}-{os.getpid()}"  # the pods' cgroup_parent
        self.process: subprocess.Popen | None = None
        self.kubelet: Kubelet | None = None

    def install_handler(self) -> subprocess.CompletedProcess:
        return sh(GPUCKPT, "install", "--engine", "containerd", "--config", str(self.config),
                  "--runtime-path", RUNTIME, "--no-hook")

    def start(self) -> Kubelet:
        for directory in (self.root / "cni-bin", self.root / "cni-conf", self.state):
            directory.mkdir(parents=True, exist_ok=True)
        # containerd looks its shim up on PATH first: forky's shim, not bookworm's 1.6 one in /usr/bin;
        # CRIU (go-criu's version check, runc's swrk) is the test bed's wrapper in /usr/local/sbin.
        env = {"PATH": f"{PREFIX}/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "GPUCKPT_CONFIG": str(self.gpuckpt_config)}
        with open(self.log, "ab") as log, open(os.devnull, "rb") as null:
            self.process = subprocess.Popen([str(CONTAINERD), "--config", str(self.config)], stdin=null,
                                            stdout=log, stderr=log, env=env, start_new_session=True)
        self.kubelet = Kubelet(self.socket)
        try:
            self.kubelet.wait_ready(timeout_s=60)
        except Exception:
            raise AssertionError(f"containerd {self.name} did not answer:\n{self.log_tail()}") from None
        return self.kubelet

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def stop(self) -> None:
        """Pods removed through the CRI, then containerd stopped; whatever a failed removal left (the node's shims,
        found by this node's socket in their command line, and the processes in the node's cgroups) killed by PID;
        mounts, directories and cgroups removed. The first error is raised after all of it."""
        errors: list[str] = []
        if self.kubelet is not None:
            try:
                for pod_id in self.kubelet.pods():
                    try:
                        self.kubelet.stop_and_remove_pod(pod_id)
                    except Exception as error:
                        errors.append(f"removing pod {pod_id[:12]}: {str(error).splitlines()[0]}")
            finally:
                self.kubelet.close()
                self.kubelet = None
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None
        for pid in self._shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        kill_and_remove_cgroups(self.cgroup_parent)
        for directory in (self.state, self.root):
            umount_below(directory)
            shutil.rmtree(directory, ignore_errors=True)
        if errors:
            raise AssertionError("; ".join(errors))

    def _shim_pids(self) -> list[int]:
        marker = f"-address\0{self.socket}\0".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if marker in (entry / "cmdline").read_bytes():
                        pids.append(int(entry.name))
        return pids


def kill_and_remove_cgroups(parent: str, deadline_s: float = 10) -> None:
    """Every process in the cgroups under `parent` (in any hierarchy) thawed and killed, the cgroups removed,
    deepest first."""
    tops = [hierarchy / parent.lstrip("/") for hierarchy in Path("/sys/fs/cgroup").iterdir()
            if not hierarchy.is_symlink()]

    def cgroups() -> list[Path]:
        found = [path for top in tops if top.is_dir() for path in [top, *top.rglob("*")] if path.is_dir()]
        return sorted(found, key=lambda path: -len(path.parts))

    # a frozen process (a checkpoint's pause left in place) takes SIGKILL only once thawed, in every hierarchy
    for directory in cgroups():
        for switch, thawed in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
            with contextlib.suppress(OSError):
                (directory / switch).write_text(thawed)
    stop = time.monotonic() + deadline_s
    while (left := cgroups()) and time.monotonic() < stop:
        for directory in left:
            with contextlib.suppress(OSError, ValueError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):
                directory.rmdir()
        time.sleep(0.1)
