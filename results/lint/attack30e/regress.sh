#!/bin/bash
# attack30e: a plain podman container, this node's own signed dump, checkpointed and restored in place (the shim's
# signed path), N times: CRIU 4.2.1 dumps freezer.state's perms uninitialised (heap bytes), and cgroup_problems
# refuses those whose garbage has set-id/sticky bits.
N=${1:-6}; shift; CMD=("${@:-sleep 1000}")  # the workload: sleep, or sh -c "a loop"
for i in $(seq $N); do
  podman rm -f -t 0 attack30e-live >/dev/null 2>&1
  podman run -d --name attack30e-live --network none localhost/gpuckpt-test:latest "${CMD[@]}" >/dev/null; sleep 1
  podman container checkpoint --keep attack30e-live >/dev/null 2>&1 || { echo "$i checkpoint failed"; continue; }
  d=$(podman inspect attack30e-live --format '{{.StaticDir}}')
  m=$(crit decode -i $d/checkpoint/cgroup.img | python3 -c "
import json,sys; d=json.load(sys.stdin)['entries'][0]
print(*[oct(p['perms']['mode']) + ' uid ' + str(p['perms']['uid']) for c in d['controllers'] for x in c.get('dirs',[]) for p in x.get('properties',[]) if p['name']=='freezer.state'])")
  r=$(timeout 200 podman container restore attack30e-live 2>&1); rc=$?
  echo "$i freezer.state perms $m; restore rc=$rc: $(echo "$r" | tail -1 | sed 's/.*spec grants: //' | cut -c1-220)"
done
podman rm -f -t 0 attack30e-live >/dev/null 2>&1
