"""A CRI client for the tests: what kubelet asks of a container runtime, over the runtime's socket.

Kubernetes' CRI api.proto (integration/cri/, cri-api v0.32.3, the version containerd 2.1 vendors) is
compiled with grpcio-tools once per test session (its gogoproto options, Go-only, left out). `Kubelet`
makes the calls kubelet makes, in its order: RunPodSandbox with a runtime handler, CreateContainer,
StartContainer, ExecSync, CheckpointContainer into an archive, and the restore containerd 2.1 offers:
CreateContainer whose image is that archive.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import grpc
from grpc_tools import protoc

PROTO = Path(__file__).parent / "cri" / "api.proto"
CRI_API_VERSION = "v0.32.3"  # k8s.io/cri-api tag the proto was taken from (commit 67fcf83dd3a3)
_compiled: dict[str, ModuleType] = {}


def _compile() -> tuple[ModuleType, ModuleType]:
    """api_pb2 and api_pb2_grpc, generated into a temporary directory on first use."""
    if not _compiled:
        out = Path(tempfile.mkdtemp(prefix="gpuckpt-cri-proto-"))
        text = PROTO.read_text()
        # gogoproto's options only steer Go code generation; its .proto is not kept here.
        text = re.sub(r'^import "github.com/gogo/protobuf/gogoproto/gogo.proto";\n', "", text, flags=re.M)
        text = re.sub(r"^option \(gogoproto\.[a-z_]+\) = [a-z ]+;\n", "", text, flags=re.M)
        assert "gogoproto" not in text, "api.proto: a gogoproto option was left"
        (out / "api.proto").write_text(text)
        include = Path(protoc.__file__).parent / "_proto"
        status = protoc.main(["protoc", f"-I{out}", f"-I{include}", f"--python_out={out}",
                              f"--grpc_python_out={out}", str(out / "api.proto")])
        assert status == 0, f"protoc failed on {PROTO} (status {status})"
        sys.path.insert(0, str(out))
        _compiled["pb"] = importlib.import_module("api_pb2")
        _compiled["grpc"] = importlib.import_module("api_pb2_grpc")
    return _compiled["pb"], _compiled["grpc"]


class Kubelet:
    """One CRI runtime endpoint (a unix socket), driven as kubelet drives it."""

    def __init__(self, socket_path: str | Path, timeout_s: float = 120) -> None:
        self.pb, stubs = _compile()
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.runtime = stubs.RuntimeServiceStub(self.channel)
        self.images = stubs.ImageServiceStub(self.channel)
        self.timeout_s = timeout_s

    def close(self) -> None:
        self.channel.close()

    def version(self):
        return self.runtime.Version(self.pb.VersionRequest(version="v1"), timeout=self.timeout_s)

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.version()
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def pull(self, image: str) -> str:
        request = self.pb.PullImageRequest(image=self.pb.ImageSpec(image=image))
        return self.images.PullImage(request, timeout=self.timeout_s).image_ref

    def pod_config(self, name: str, uid: str, cgroup_parent: str, annotations: dict[str, str] | None = None,
                   own_network: bool = False):
        """A pod on the node's network, or in a network namespace of its own made by the node's CNI plugins
        (`own_network`), its own PID namespace per container, as kubelet's defaults; `annotations` are the
        pod's (kubelet passes a Pod's metadata.annotations)."""
        pb = self.pb
        network = pb.POD if own_network else pb.NODE
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="gpuckpt-it", attempt=0),
            annotations=annotations or {},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=network, pid=pb.CONTAINER, ipc=pb.POD))))

    def run_pod(self, config, handler: str) -> str:
        request = self.pb.RunPodSandboxRequest(config=config, runtime_handler=handler)
        return self.runtime.RunPodSandbox(request, timeout=self.timeout_s).pod_sandbox_id

    def create(self, pod_id: str, pod_config, name: str, image: str, command: list[str] | None = None,
               envs: dict[str, str] | None = None, mounts: Sequence[tuple[str, str, bool]] = (),
               devices: Sequence[str] = (), working_dir: str = "", cdi_devices: Sequence[str] = ()) -> str:
        """A container; `mounts` are (host path, container path, read-only), `devices` host device nodes given at
        the same path, `cdi_devices` fully qualified CDI names (`nvidia.com/gpu=0`) as a device plugin in CDI mode
        hands them to kubelet (ContainerConfig.CDI_devices; containerd 2.1 applies the node's spec for them when
        its enable_cdi is on). A restore's CreateContainer must repeat the original's mounts and devices, as
        kubelet does from the same pod spec: containerd builds the restored container's spec from this request."""
        pb = self.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image, user_specified_image=image),
            command=command or [],
            working_dir=working_dir,
            envs=[pb.KeyValue(key=key, value=value) for key, value in (envs or {}).items()],
            mounts=[pb.Mount(host_path=host, container_path=inside, readonly=readonly)
                    for host, inside, readonly in mounts],
            devices=[pb.Device(host_path=path, container_path=path, permissions="rwm") for path in devices],
            CDI_devices=[pb.CDIDevice(name=name) for name in cdi_devices],
            labels={"io.kubernetes.container.name": name},
            linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
                namespace_options=pb.NamespaceOption(
                    network=pod_config.linux.security_context.namespace_options.network, pid=pb.CONTAINER,
                    ipc=pb.POD))))
        request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config)
        return self.runtime.CreateContainer(request, timeout=self.timeout_s).container_id

    def start(self, container_id: str) -> None:
        self.runtime.StartContainer(self.pb.StartContainerRequest(container_id=container_id), timeout=self.timeout_s)

    def exec_sync(self, container_id: str, command: list[str], timeout_s: int = 20) -> tuple[int, str, str]:
        request = self.pb.ExecSyncRequest(container_id=container_id, cmd=command, timeout=timeout_s)
        reply = self.runtime.ExecSync(request, timeout=timeout_s + 10)
        return reply.exit_code, reply.stdout.decode(errors="replace"), reply.stderr.decode(errors="replace")

    def status(self, container_id: str):
        request = self.pb.ContainerStatusRequest(container_id=container_id)
        return self.runtime.ContainerStatus(request, timeout=self.timeout_s).status

    def runtime_spec(self, container_id: str) -> dict:
        """The OCI spec the runtime was given, from the verbose status (containerd's `info`)."""
        request = self.pb.ContainerStatusRequest(container_id=container_id, verbose=True)
        info = self.runtime.ContainerStatus(request, timeout=self.timeout_s).info
        return json.loads(info["info"])["runtimeSpec"]

    def checkpoint(self, container_id: str, archive: str | Path, timeout_s: int = 300) -> None:
        """kubelet's ContainerCheckpoint: the runtime writes the archive; the container keeps running."""
        request = self.pb.CheckpointContainerRequest(container_id=container_id, location=str(archive),
                                                     timeout=timeout_s)
        self.runtime.CheckpointContainer(request, timeout=timeout_s + 30)

    def stop_and_remove_pod(self, pod_id: str) -> None:
        self.runtime.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout_s)
        self.runtime.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout_s)

    def pods(self) -> list[str]:
        reply = self.runtime.ListPodSandbox(self.pb.ListPodSandboxRequest(), timeout=self.timeout_s)
        return [pod.id for pod in reply.items]
