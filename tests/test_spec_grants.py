"""A restore spec grants no more than the checkpointed spec did (policy/spec_grants.py): the second review's F9,
an edited spec.dump of a signed dump restored by podman's own --import."""

from __future__ import annotations

import copy
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from gpuckpt.host.podman_state import PodmanRecord
from gpuckpt.oci.manifest import Manifest, SpecGrants
from gpuckpt.oci.spec import Spec
from gpuckpt.policy.devices import DeviceAllowance, DeviceId
from gpuckpt.policy.spec_grants import grants_of as _grants_of
from gpuckpt.policy.spec_grants import namespace_path_refusals
from gpuckpt.policy.spec_grants import widened as _widened

# this node's NVIDIA devices for the tests: two GPUs' nodes; no operator allow-list
ALLOWANCE = DeviceAllowance(nvidia=[DeviceId("c", 195, 0), DeviceId("c", 195, 1), DeviceId("c", 195, 255)], listed=[])


def grants_of(spec: Spec, container_id: str = "") -> SpecGrants:
    return _grants_of(spec, container_id, ALLOWANCE)


def widened(recorded: SpecGrants, spec: Spec, own_hooks: frozenset[str], **options) -> list[str]:
    return _widened(recorded, spec, own_hooks, allowance=ALLOWANCE, **options)

OWN_HOOK = "/usr/bin/gpuckpt-hook"
OLD, NEW = "a" * 64, "b" * 64
SPEC = {
    "mounts": [{"destination": "/etc/hosts", "type": "bind", "options": ["rbind", "rw"],
                "source": f"/var/lib/containers/storage/overlay-containers/{OLD}/userdata/hosts"},
               {"destination": "/data", "type": "bind", "options": ["rbind", "rw"], "source": "/srv/data"}],
    "process": {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"], "effective": ["CAP_CHOWN"]}},
    "hooks": {"createRuntime": [{"path": OWN_HOOK, "args": ["gpuckpt-hook", "createRuntime"], "timeout": 60}],
              "createContainer": [{"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"]}]},
    "linux": {"devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
                          {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
              "resources": {"devices": [{"allow": False, "access": "rwm"},
                                        {"allow": True, "type": "c", "major": 10, "minor": 229, "access": "rwm"},
                                        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rw"}]}},
}


def spec(change=lambda spec: None) -> Spec:
    changed = copy.deepcopy(SPEC)
    change(changed)
    return Spec.model_validate(changed)


@pytest.fixture(autouse=True)
def gpu_nodes(tmp_path_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """This node's /dev as the device check reads it, with the NVIDIA nodes the specs name (195:0, 195:1): an
    allowed number counts only as the device node at its path on the node (attack30h)."""
    if os.geteuid() != 0:
        pytest.skip("device nodes are made with mknod, which needs root")
    dev = tmp_path_factory.mktemp("dev")
    for minor in (0, 1):
        os.mknod(dev / f"nvidia{minor}", 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    monkeypatch.setenv("GPUCKPT_DEV_DIR", str(dev))


def recorded() -> SpecGrants:
    """The grants of the checkpointed spec, as the checkpoint recorded them on this node (gpu_nodes)."""
    return grants_of(spec())


def test_the_checkpointed_spec_restores_and_its_grants_travel_in_the_manifest() -> None:
    assert widened(recorded(), spec(), frozenset({OWN_HOOK})) == []
    assert recorded().devices == ["/dev/fuse (c 10:229)"]  # NVIDIA's by its numbers, left to the GPU checks
    assert recorded().device_rules == ["cgroup rule allow c 10:229 rwm"]
    manifest = Manifest(created="2026-11-28T00:00:00Z", container_id="c1", spec_grants=recorded())
    assert Manifest.model_validate_json(manifest.model_dump_json()).spec_grants == recorded()


@pytest.mark.hostile("restore spec with a hook the checkpointed spec did not have (spec.dump edited)")
def test_a_hook_added_is_refused() -> None:
    def add(changed: dict) -> None:
        changed["hooks"]["createRuntime"].append({"path": "/bin/sh", "args": ["sh", "-c", "id > /x"]})
    assert widened(recorded(), spec(add), frozenset({OWN_HOOK})) == ["hooks (createRuntime /bin/sh)"]


@pytest.mark.hostile("restore spec running a recorded hook program with other arguments")
def test_the_same_hook_program_run_otherwise_is_refused() -> None:
    def other_args(changed: dict) -> None:
        changed["hooks"]["createContainer"][0]["args"] = ["nvidia-cdi-hook", "create-symlinks", "--link", "/:/x"]
    assert widened(recorded(), spec(other_args), frozenset({OWN_HOOK})) == [
        "hooks (createContainer /usr/bin/nvidia-cdi-hook)"]


def test_the_nodes_own_hook_and_other_gpus_are_not_counted() -> None:
    def engine_changes(changed: dict) -> None:
        changed["hooks"]["poststop"] = [{"path": OWN_HOOK, "args": ["gpuckpt-hook", "poststop"], "timeout": 60}]
        changed["linux"]["devices"][1] = {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}
        changed["linux"]["resources"]["devices"][2]["minor"] = 1
    assert widened(recorded(), spec(engine_changes), frozenset({OWN_HOOK})) == []


@pytest.mark.hostile("restore spec with a capability or a host device the checkpointed spec did not have")
def test_a_capability_or_a_device_added_is_refused() -> None:
    def more(changed: dict) -> None:
        changed["process"]["capabilities"]["permitted"] = ["CAP_SYS_ADMIN"]
        changed["linux"]["devices"].append({"path": "/dev/kmsg", "type": "c", "major": 1, "minor": 11})
    assert widened(recorded(), spec(more), frozenset({OWN_HOOK})) == [
        "capabilities (CAP_SYS_ADMIN)", "device nodes (/dev/kmsg (c 1:11))"]


@pytest.mark.hostile("restore spec with a cgroup rule for a host device only (its node from the archive's diff) "
                     "(third review G2)")
def test_a_device_rule_added_is_refused() -> None:
    def rule(changed: dict) -> None:
        changed["linux"]["resources"]["devices"].append(
            {"allow": True, "type": "c", "major": 1, "minor": 11, "access": "rw"})
    assert widened(recorded(), spec(rule), frozenset({OWN_HOOK})) == ["device rules (cgroup rule allow c 1:11 rw)"]


@pytest.mark.hostile("restore spec naming a host device by an NVIDIA path (/dev/nvidia-x as c 1:11)")
def test_an_nvidia_path_with_other_numbers_is_a_host_device() -> None:
    def disguised(changed: dict) -> None:
        changed["linux"]["devices"].append({"path": "/dev/nvidia-x", "type": "c", "major": 1, "minor": 11})
    assert widened(recorded(), spec(disguised), frozenset({OWN_HOOK})) == ["device nodes (/dev/nvidia-x (c 1:11))"]


@pytest.mark.hostile("restore spec running gpuckpt-hook's own path with an environment of its choosing (LD_PRELOAD) "
                     "(third review G1)")
def test_the_hooks_own_path_run_otherwise_is_refused() -> None:
    def preloaded(changed: dict) -> None:
        changed["hooks"]["createRuntime"].append({"path": OWN_HOOK, "args": ["gpuckpt-hook", "createRuntime"],
                                                  "env": ["LD_PRELOAD=/tmp/evil.so"], "timeout": 60})
    assert widened(recorded(), spec(preloaded), frozenset({OWN_HOOK})) == [f"hooks (createRuntime {OWN_HOOK})"]


def test_grants_refuse_what_is_not_a_capability_or_a_device() -> None:
    with pytest.raises(ValueError):
        SpecGrants(capabilities=["CAP_X; rm"])
    with pytest.raises(ValueError):
        SpecGrants(devices=["c 1:11\n"])


@pytest.mark.hostile("an unsigned dump (restore:any allowed) whose restore spec carries a hook of its own")
def test_an_unsigned_dump_restores_no_hook_but_gpuckpts() -> None:
    """Nothing vouches for an unsigned dump's record: every hook but gpuckpt-hook's counts (its devices are the
    import allow-list's to judge)."""
    assert widened(SpecGrants(), spec(), frozenset({OWN_HOOK}), hooks_only=True) == [
        "hooks (createContainer /usr/bin/nvidia-cdi-hook)"]


def test_the_same_binds_under_a_new_container_id_restore() -> None:
    """podman's --import with --name: a new ID, its own directories bound again; a bind made read-only is fine."""
    recorded = grants_of(spec(), OLD)

    def renamed(changed: dict) -> None:
        changed["mounts"][0]["source"] = changed["mounts"][0]["source"].replace(OLD, NEW)
        changed["mounts"][1]["options"] = ["rbind", "ro"]
    assert widened(recorded, spec(renamed), frozenset({OWN_HOOK}), container_id=NEW) == []


@pytest.mark.hostile("restore spec (podman's, from spec.dump) binding a host path, or another container's directory")
def test_a_bind_added_or_pointed_elsewhere_is_refused() -> None:
    recorded = grants_of(spec(), OLD)

    def host_root(changed: dict) -> None:
        changed["mounts"].append({"destination": "/host", "type": "bind", "options": ["rbind"], "source": "/"})
        changed["mounts"][0]["source"] = changed["mounts"][0]["source"].replace(OLD, "c" * 64)
    problems = widened(recorded, spec(host_root), frozenset({OWN_HOOK}), container_id=NEW)
    assert len(problems) == 1 and problems[0].startswith(
        f"bind mounts (/etc/hosts <- /var/lib/containers/storage/overlay-containers/{'c' * 64}/userdata/hosts rw, "
        "/host <- / rw")


@pytest.mark.hostile("restore spec binding a look-alike of podman's container directory that another user can swap")
def test_a_look_alike_of_the_containers_directory_another_user_can_swap_is_a_host_path(tmp_path) -> None:
    recorded = grants_of(spec(), OLD)
    swappable = tmp_path / "anyone"
    swappable.mkdir(mode=0o777)
    swappable.chmod(0o777)  # no sticky bit: another user may rename what is in it

    def look_alike(changed: dict) -> None:
        changed["mounts"][0]["source"] = f"{swappable}/overlay-containers/{NEW}/userdata/hosts"
    own = (f"/var/lib/containers/storage/overlay-containers/{NEW}/userdata",)  # podman's, as the restore names it
    problems = widened(recorded, spec(look_alike), frozenset({OWN_HOOK}), container_id=NEW, own_dirs=own)
    assert len(problems) == 1 and problems[0].startswith(f"bind mounts (/etc/hosts <- {swappable}/overlay-containers/")


@pytest.mark.hostile("restore spec binding a path below the container's own directory that climbs out with '..', "
                     "or through a link an archive planted there (attack30f: the host's / and /etc)")
def test_a_path_below_the_containers_directory_that_climbs_out_or_through_a_link_is_a_host_path(tmp_path) -> None:
    root = tmp_path / "storage"
    own = root / "overlay-containers" / NEW / "userdata"
    own.mkdir(parents=True)
    for directory in (tmp_path, root, root / "overlay-containers", own.parent, own):
        directory.chmod(0o755)
    (own / "link").symlink_to("/")
    (own / "hosts").write_text("")

    def checkpointed(changed: dict) -> None:
        changed["mounts"][0]["source"] = f"{root}/overlay-containers/{OLD}/userdata/hosts"
    recorded = grants_of(spec(checkpointed), OLD)
    for source in (f"{own}/hosts", f"{own}/../../../../../..", f"{own}/link/.", f"{own}/link/etc/hosts"):
        def bound(changed: dict, source: str = source) -> None:
            changed["mounts"][0]["source"] = source
        problems = widened(recorded, spec(bound), frozenset({OWN_HOOK}), container_id=NEW, own_dirs=(str(own),))
        if source.endswith("/hosts") and "link" not in source:
            assert problems == [], problems  # the container's own file, under its new ID
        else:
            shown = f"bind mounts (/etc/hosts <- {source}"[:150]  # a phrase shows 160 characters of a bind
            assert len(problems) == 1 and problems[0].startswith(shown), problems


@pytest.mark.hostile("restore spec joining the host's namespaces by path, or by a path a user or a container can "
                     "swap after the check (attack30h, attack30i: /proc/PID/ns/net of a host process; a missing "
                     "target turned into a link to /proc/self/ns/net)")
def test_namespaces_are_joined_only_by_paths_podman_gives_and_never_the_hosts(tmp_path) -> None:
    def joining(*namespaces: dict):
        def change(changed: dict) -> None:
            changed["linux"]["namespaces"] = [{"type": "pid"}, *namespaces]
        return spec(change)
    (tmp_path / "net").symlink_to("/proc/self/ns/net")
    cases = {
        f"/proc/{os.getpid()}/ns/net": "the host's", "/proc/self/ns/net": "not a path an engine gives",
        "/proc/thread-self/ns/net": "not a path an engine gives", str(tmp_path / "net"): "not a path an engine gives",
        "/run/netns/gpuckpt-test-missing": "No such file or directory", "/proc/0/ns/net": "not a path an engine gives"}
    for path, why in cases.items():
        assert namespace_path_refusals(joining({"type": "network", "path": path})) == [f"network ({path}: {why})"]
    assert namespace_path_refusals(joining({"type": "ipc", "path": f"/proc/{os.getpid()}/ns/ipc"})) == [
        f"ipc (/proc/{os.getpid()}/ns/ipc: the host's)"]
    assert namespace_path_refusals(spec()) == []
    for engines in ("/var/run/netns/cni-x", "/run/docker/netns/ab12", "/var/run/docker/netns/ab12"):  # none here
        assert namespace_path_refusals(joining({"type": "network", "path": engines})) == [
            f"network ({engines}: No such file or directory)"]


@pytest.fixture
def other_container():
    """A process in namespaces of its own (user, IPC, network, UTS): what another container's is to the shim."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1) to make namespaces of a process's own")
    child = subprocess.Popen(["unshare", "-Uinu", "sleep", "300"])
    try:
        for _ in range(200):  # until unshare has exec'd sleep in the new namespaces
            if os.stat(f"/proc/{child.pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino:
                break
            if child.poll() is not None:
                pytest.skip("unshare -Uinu is not allowed here (unprivileged user namespaces off)")
            time.sleep(0.01)
        yield child.pid
    finally:
        child.kill()
        child.wait()


@pytest.mark.hostile("restore spec joining another container's namespaces by path (attack30k: a signed export's "
                     "spec.dump naming a running container's /run/netns/netns-... or /proc/PID/ns/net reached its "
                     "loopback services; /proc/PID/ns/ipc and uts shared its IPC and set its hostname)")
def test_another_containers_namespaces_are_refused_unless_podman_put_them_there(other_container) -> None:
    pid = other_container
    def joining(kind: str, path: str) -> Spec:
        def change(changed: dict) -> None:
            changed["linux"]["namespaces"] = [{"type": "pid"}, {"type": kind, "path": path}]
        return spec(change)
    allowed = "allowed: the namespace podman made for this container, its pod's infra container's, or one no " \
              "process is in"
    for kind, name in (("network", "net"), ("ipc", "ipc"), ("uts", "uts")):
        path = f"/proc/{pid}/ns/{name}"
        for record in (None, PodmanRecord(netns="", infra_pid=0), PodmanRecord(netns="/run/netns/x", infra_pid=1)):
            assert namespace_path_refusals(joining(kind, path), lambda record=record: record) == [
                f"{kind} ({path}: process {pid}'s, another container's; {allowed})"], (kind, record)
        # podman's --pod: the pod's infra container's namespaces, as podman's database names the infra
        assert namespace_path_refusals(joining(kind, path), lambda: PodmanRecord("", pid)) == []
    # the network namespace podman made for this very container (its database's record of it)
    path = f"/proc/{pid}/ns/net"
    assert namespace_path_refusals(joining("network", path), lambda: PodmanRecord(path, 0)) == []
    assert namespace_path_refusals(joining("ipc", f"/proc/{pid}/ns/ipc"), lambda: PodmanRecord(path, 0)) != []


FLIPPER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
NEWUSER, NEWNET = 0x10000000, 0x40000000
if libc.unshare(NEWUSER | NEWNET):
    sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
first = os.open("/proc/self/ns/net", os.O_RDONLY)
libc.unshare(NEWNET)
second = os.open("/proc/self/ns/net", os.O_RDONLY)
print("ready", flush=True)
while True:
    for namespace in (first, second):
        libc.setns(namespace, NEWNET)
        time.sleep(0.001)
"""


@pytest.mark.hostile("restore spec joining a user's network namespace by /proc/PID/ns/net while that process flips "
                     "between two of its own, so the scan for processes in it finds none (attack30l: a signed "
                     "export under the default policy restored in the user's namespace; the user handed the "
                     "container's root an fd of the host's / over an abstract unix socket: host files written)")
def test_a_process_flipping_between_its_namespaces_is_still_in_the_one_its_path_names() -> None:
    flipper = subprocess.Popen([sys.executable, "-c", FLIPPER], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if flipper.stdout.readline() != b"ready\n":
            pytest.skip(f"no network namespaces of a process's own here: {flipper.stderr.read().decode()[:200]}")
        path = f"/proc/{flipper.pid}/ns/net"
        joining = spec(lambda changed: changed["linux"].update(namespaces=[{"type": "network", "path": path}]))
        verdicts = [namespace_path_refusals(joining, lambda: PodmanRecord("", 0)) for _ in range(40)]
    finally:
        flipper.kill()
        flipper.wait()
    allowed = "allowed: the namespace podman made for this container, its pod's infra container's, or one no " \
              "process is in"
    assert [verdict for verdict in verdicts if verdict != [
        f"network ({path}: process {flipper.pid}'s, another container's; {allowed})"]] == []


@pytest.mark.hostile("restore spec naming as a namespace a file that is none (/run/netns/.. is /run), or a pod's "
                     "infra container's mount namespace, which podman never shares")
def test_only_namespace_files_and_what_a_pod_shares_pass() -> None:
    if os.path.isdir("/run/netns"):
        dotdot = spec(lambda changed: changed["linux"].update(
            namespaces=[{"type": "network", "path": "/run/netns/.."}]))
        assert namespace_path_refusals(dotdot) == ["network (/run/netns/..: not a namespace)"]
    infra = subprocess.Popen(["unshare", "-Umn", "sleep", "300"])  # an infra container: mount and network its own
    try:
        for _ in range(200):
            if os.stat(f"/proc/{infra.pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino:
                break
            if infra.poll() is not None:
                pytest.skip("unshare -Umn is not allowed here")
            time.sleep(0.01)
        verdicts = {}
        for kind, name in (("mount", "mnt"), ("network", "net")):
            path = f"/proc/{infra.pid}/ns/{name}"
            joining = spec(lambda changed, kind=kind, path=path: changed["linux"].update(
                namespaces=[{"type": kind, "path": path}]))
            verdicts[kind] = namespace_path_refusals(joining, lambda: PodmanRecord("", infra.pid))
    finally:
        infra.kill()
        infra.wait()
    assert verdicts == {"network": [], "mount": [
        f"mount (/proc/{infra.pid}/ns/mnt: process {infra.pid}'s, another container's; allowed: the namespace "
        "podman made for this container, its pod's infra container's, or one no process is in)"]}
