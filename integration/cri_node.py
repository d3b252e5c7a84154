"""The CRI tests' nodes: a private containerd 2.1 (integration/testbed/containerd.sh put Debian forky's in
/opt/gpuckpt/containerd) with its own root, state, socket and config, and the OCI images its pods pull.

A node's config is the test bed's (its directories, the sandbox image, no CNI: the pods use the node's
network) with gpuckpt's runtime handler added by `gpuckpt install --engine containerd --config`, as an
operator adds it. The system's containerd 1.6 (docker's) is never touched. A node is started, used and
stopped by a fixture: its pods removed through the CRI, containerd stopped by its PID, what it mounted
below its root and state unmounted, both removed. Standard library and cri_client only: the GPU machine's
scenario (integration/gpu/cri_gpu.py) uses it without pytest.
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
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

from cri_client import Kubelet

PREFIX = Path(os.environ.get("GPUCKPT_CONTAINERD_PREFIX", "/opt/gpuckpt/containerd"))
CONTAINERD = PREFIX / "usr" / "bin" / "containerd"
HANDLER = "gpuckpt"  # the runtime handler `gpuckpt install --engine containerd` registers (a RuntimeClass's handler)
CNI_PLUGINS = "/usr/lib/cni"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


def stream_blob(blobs: Path, chunks: Iterator[bytes]) -> tuple[str, int]:
    """`chunks` written once into `blobs`, named by their sha256 as they pass: the digest and the size."""
    digest, size = hashlib.sha256(), 0
    partial = blobs / f".partial-{os.getpid()}"
    with open(partial, "wb") as out:
        for chunk in chunks:
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    partial.rename(blobs / digest.hexdigest())
    return f"sha256:{digest.hexdigest()}", size


def tar_of(directory: Path, exclude: tuple[str, ...] = ()) -> Iterator[bytes]:
    """`directory`'s tree as a tar stream (GNU tar, numeric owners): a layer of GBs never lies on disk twice."""
    excluded = [arg for name in exclude for arg in ("--exclude", f"./{name}")]
    tar = subprocess.Popen(["tar", "-C", str(directory), "--numeric-owner", *excluded, "-cf", "-", "."],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert tar.stdout is not None and tar.stderr is not None
    while chunk := tar.stdout.read(1 << 20):
        yield chunk
    if tar.wait() != 0:
        raise RuntimeError(f"tar of {directory} exited {tar.returncode}: {tar.stderr.read().decode()[-500:]}")


def write_layout(layout: Path, layer: str | Path, cmd: list[str], tag: str = "latest",
                 exclude: tuple[str, ...] = ()) -> None:
    """A one-layer OCI image layout (uncompressed layer) running `cmd`, tagged `tag`: the layer a tar file, or a
    directory streamed into one (less its top-level names `exclude`)."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def blob(data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data)
        (blobs / digest.hexdigest()).write_bytes(data)
        return f"sha256:{digest.hexdigest()}", len(data)

    def file_chunks(source: str | Path) -> Iterator[bytes]:
        with open(source, "rb") as file:
            while chunk := file.read(1 << 20):
                yield chunk

    layer_digest, layer_size = stream_blob(blobs, tar_of(Path(layer), exclude) if os.path.isdir(layer)
                                           else file_chunks(layer))
    config = {"architecture": "amd64", "os": "linux", "config": {"Cmd": cmd, "Env": [f"PATH={IMAGE_PATH}"]},
              "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}
    config_digest, config_size = blob(json.dumps(config).encode())
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                           "size": config_size},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                            "size": layer_size}]}
    manifest_digest, manifest_size = blob(json.dumps(manifest).encode())
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    index = layout / "index.json"
    manifests = json.loads(index.read_text())["manifests"] if index.exists() else []
    manifests.append({"mediaType": MANIFEST_TYPE, "digest": manifest_digest, "size": manifest_size,
                      "annotations": {"org.opencontainers.image.ref.name": tag}})
    index.write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))


@contextlib.contextmanager
def layout_registry(layout: Path) -> Iterator[str]:
    """A read-only registry on 127.0.0.1 serving one OCI layout's tags as `localhost:PORT/<any name>:<tag>`,
    for the GPU machine, which has no registry program (the CI machine runs Debian's docker-registry):
    containerd pulls from a localhost registry over plain HTTP, and a restore pulls the base image by digest."""
    tags = {entry["annotations"]["org.opencontainers.image.ref.name"]: entry["digest"]
            for entry in json.loads((layout / "index.json").read_text())["manifests"]}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def handle(self) -> None:
            # containerd tries HTTPS first and falls back to HTTP when the answer to its TLS hello is HTTP's
            if self.request.recv(1, socket.MSG_PEEK) == b"\x16":
                self.request.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            super().handle()

        def do_HEAD(self) -> None:
            self.serve(body=False)

        def do_GET(self) -> None:
            self.serve(body=True)

        def serve(self, body: bool) -> None:
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts == ["v2"]:
                return self.reply(b"{}", None, "application/json", None, body)
            if len(parts) >= 4 and parts[0] == "v2" and parts[-2] in ("manifests", "blobs"):
                reference = parts[-1]
                digest = tags.get(reference, reference) if parts[-2] == "manifests" else reference
                path = layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
                if digest.startswith("sha256:") and len(digest) == 71 and path.is_file():
                    kind = MANIFEST_TYPE if parts[-2] == "manifests" else "application/octet-stream"
                    with open(path, "rb") as blob:  # a layer of GBs goes out as it is read
                        return self.reply(blob, path.stat().st_size, kind, digest, body)
            self.send_error(404)

        def reply(self, data: BinaryIO | bytes, size: int | None, kind: str, digest: str | None,
                  body: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data) if isinstance(data, bytes) else size))
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if body and isinstance(data, bytes):
                self.wfile.write(data)
            elif body:
                shutil.copyfileobj(data, self.wfile, 1 << 20)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def base_config(root: Path, state: Path, socket_path: Path, sandbox_image: str, snapshotter: str = "overlayfs",
                cdi_spec_dirs: tuple[str, ...] = (), discard_unpacked_layers: bool = False) -> str:
    """containerd 2.x (config version 3) for one test node: its own directories and sockets, nothing shared
    with the system's containerd, no CNI network (the pods use the node's), NRI off. CDI on where `cdi_spec_dirs`
    are given, reading only those (containerd's default, /etc/cdi and /var/run/cdi, would take in the specs other
    tests on this machine write there): a container's CDI_devices are resolved against them, as on a node whose
    device plugin runs in CDI mode. `discard_unpacked_layers`: a pulled layer's blob is dropped once unpacked (the
    GPU scenario's image is GBs, on a machine of little disk)."""
    assert HANDLER == "gpuckpt"
    cdi = (f"enable_cdi = true\n  cdi_spec_dirs = {json.dumps(list(cdi_spec_dirs))}" if cdi_spec_dirs
           else "enable_cdi = false")
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
  snapshotter = "{snapshotter}"
  discard_unpacked_layers = {str(discard_unpacked_layers).lower()}

# the transfer service unpacks for one snapshotter: the same as the CRI's
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/amd64"
  snapshotter = "{snapshotter}"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{sandbox_image}"

[plugins.'io.containerd.cri.v1.runtime']
  {cdi}
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

    def __init__(self, name: str, work: Path, sandbox_image: str, *, gpuckpt: str, runtime: str,
                 containerd: Path = CONTAINERD, snapshotter: str = "overlayfs", gpuckpt_config: str | None = None,
                 path_first: tuple[str, ...] = (), pod_networks: bool = False,
                 cdi_spec_dirs: tuple[str, ...] = (), discard_unpacked_layers: bool = False) -> None:
        self.name = name
        self.pod_networks = pod_networks  # pods may have a network namespace of their own (CNI: a bridge of this node)
        self.bridge = f"gck{os.getpid() % 100000}{zlib.crc32(name.encode()) % 100}"[:15]
        self.root = Path("/var/lib/gpuckpt-cri") / f"{name}-{os.getpid()}"
        self.state = Path("/run/gpuckpt-cri") / f"{name}-{os.getpid()}"
        self.socket = self.state / "containerd.sock"
        self.config = work / f"{name}-config.toml"
        self.log = work / f"{name}-containerd.log"
        self.config.write_text(base_config(self.root, self.state, self.socket, sandbox_image, snapshotter,
                                             cdi_spec_dirs, discard_unpacked_layers))
        self.gpuckpt, self.runtime, self.containerd, self.path_first = gpuckpt, runtime, containerd, path_first
        # gpuckpt-runtime's own config for this node's containers, when given (containerd's environment reaches the
        # shim and the runtime it runs): on the CI machine other tests rewrite /etc/gpuckpt/config.toml as they run.
        self.gpuckpt_config: Path | None = None
        if gpuckpt_config is not None:
            self.gpuckpt_config = work / f"{name}-gpuckpt.toml"
            self.gpuckpt_config.write_text(gpuckpt_config)
        self.cgroup_parent = f"/gpuckpt-cri-{name}-{os.getpid()}"  # the pods' cgroup_parent
        self.process: subprocess.Popen | None = None
        self.kubelet: Kubelet | None = None

    def install_handler(self) -> str:
        """`gpuckpt install --engine containerd --config` on this node's config; what it printed."""
        done = subprocess.run([self.gpuckpt, "install", "--engine", "containerd", "--config", str(self.config),
                               "--runtime-path", self.runtime], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"gpuckpt install exited {done.returncode}: {done.stderr}"
        return done.stdout

    def start(self) -> Kubelet:
        for directory in (self.root / "cni-bin", self.root / "cni-conf", self.state):
            directory.mkdir(parents=True, exist_ok=True)
        if self.pod_networks:  # Debian's containernetworking-plugins: a pod's own namespace on a bridge of this node's
            for plugin in ("loopback", "bridge", "host-local"):
                shutil.copy(os.path.join(CNI_PLUGINS, plugin), self.root / "cni-bin" / plugin)
            subnet = f"10.233.{zlib.crc32(self.bridge.encode()) % 250}.0/24"  # nothing leaves it: no route, no NAT
            (self.root / "cni-conf" / "10-gpuckpt.conflist").write_text(json.dumps({
                "cniVersion": "1.0.0", "name": f"gpuckpt-{self.name}", "plugins": [{
                    "type": "bridge", "bridge": self.bridge, "isGateway": False, "ipMasq": False,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                             "dataDir": str(self.root / "cni-ipam")}}]}))
        # containerd looks its shim up on PATH first: forky's shim beside it, not bookworm's 1.6 one in /usr/bin;
        # CRIU (go-criu's version check, runc's swrk) is the test bed's wrapper in /usr/local/sbin (or path_first).
        path = [str(self.containerd.parent), *self.path_first, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                "/usr/bin", "/sbin", "/bin"]
        env = {"PATH": ":".join(path), "HOME": "/root", "LANG": "C.UTF-8"}
        if self.gpuckpt_config is not None:
            env["GPUCKPT_CONFIG"] = str(self.gpuckpt_config)
        with open(self.log, "ab") as log, open(os.devnull, "rb") as null:
            self.process = subprocess.Popen([str(self.containerd), "--config", str(self.config)], stdin=null,
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
        if self.pod_networks:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        for directory in (self.state, self.root):
            umount_below(directory)
            shutil.rmtree(directory, ignore_errors=True)
            with contextlib.suppress(OSError):
                directory.parent.rmdir()  # the last node here takes /run/gpuckpt-cri and /var/lib/gpuckpt-cri along
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
