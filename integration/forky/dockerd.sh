#!/usr/bin/env bash
# Start Debian forky's dockerd 28 (and the containerd 2.1 it supervises) inside the forky root, for
# test_docker28.py; inside.sh runs it after `gpuckpt install --engine docker`. Everything is the
# root's own: its data root /var/lib/docker (in the cached root), exec root and socket under the
# namespace's tmpfs /run (/run/docker, /run/docker.sock, /run/docker.pid: what `docker` and
# `gpuckpt install` look for), its network namespace (only loopback and docker's own bridge). The
# host's docker is never reached: in-forky.sh gives the root private mount, PID and network
# namespaces. --iptables=false/--ip6tables=false: docker 28's firewall is iptables only (its
# nftables backend comes with docker 29) and nothing here leaves the namespace, so the bridge needs
# no NAT; podman's tests keep the namespace's iptables and nftables tables to themselves. No
# systemd is PID 1 here: cgroupfs, under a parent of the test bed's own (gpuckpt-forky-docker, not the
# host docker's "docker"), which in-forky.sh's clean-up removes with what a killed run leaves. The containers of an earlier run (its data root is kept for the
# images) are removed: every run starts with none.
set -euo pipefail
log=/var/log/gpuckpt-dockerd.log
timeout_s=${DOCKERD_TIMEOUT:-60}
if [ -S /run/docker.sock ] && docker info >/dev/null 2>&1; then
    echo "dockerd.sh: dockerd already answers on /run/docker.sock"; exit 0
fi
setsid dockerd --data-root /var/lib/docker --exec-root /run/docker --pidfile /run/docker.pid \
    -H unix:///run/docker.sock --iptables=false --ip6tables=false \
    --exec-opt native.cgroupdriver=cgroupfs --cgroup-parent /gpuckpt-forky-docker </dev/null >>"$log" 2>&1 &
for _ in $(seq 1 $((timeout_s * 5))); do
    if docker info >/dev/null 2>&1; then
        stale=$(docker ps -a -q)
        [ -z "$stale" ] || docker rm -f $stale >/dev/null
        echo "dockerd.sh: $(docker version --format 'docker {{.Server.Version}}, containerd {{range .Server.Components}}{{if eq .Name "containerd"}}{{.Version}}{{end}}{{end}}') running (pid $(cat /run/docker.pid))"
        exit 0
    fi
    sleep 0.2
done
echo "dockerd.sh: dockerd did not answer in ${timeout_s} s; last lines of $log:" >&2
tail -n 20 "$log" >&2
exit 1
