"""attack30l: podman_state's BoltDB reader against podman's own answers, for every container of this node."""
import json, subprocess
from gpuckpt.host.podman_state import podman_record
rows = json.loads(subprocess.run(["podman", "ps", "-a", "--format", "json"], capture_output=True, text=True, check=True).stdout)
bad = 0
for row in rows:
    cid = row["Id"]
    info = json.loads(subprocess.run(["podman", "inspect", cid], capture_output=True, text=True, check=True).stdout)[0]
    netns = info["NetworkSettings"].get("SandboxKey", "")
    infra_pid = 0
    if info.get("Pod"):
        pod = json.loads(subprocess.run(["podman", "pod", "inspect", info["Pod"]], capture_output=True, text=True, check=True).stdout)
        pod = pod[0] if isinstance(pod, list) else pod
        infra = json.loads(subprocess.run(["podman", "inspect", pod["InfraContainerID"]], capture_output=True, text=True, check=True).stdout)[0]
        infra_pid = infra["State"]["Pid"]
    rec = podman_record("/var/lib/containers/storage", "/run/containers/storage", cid)
    ok = rec is not None and rec.netns == netns and rec.infra_pid == infra_pid
    bad += not ok
    print(f"{row['Names'][0][:28]:28} {row['State']:8} db: netns={rec.netns if rec else None!r} infra={rec.infra_pid if rec else None} | podman: netns={netns!r} infra={infra_pid} {'OK' if ok else 'DIFFERS'}")
print(f"{len(rows)} containers, {bad} differ")
