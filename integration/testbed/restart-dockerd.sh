#!/usr/bin/env bash
# (Re)start dockerd in the background (no init system here) and wait until it answers.
# Stops the running one first (pid from /var/run/docker.pid); dockerd starts its own
# containerd when none is configured.  Needed after changing /etc/docker/daemon.json.
# Usage: restart-dockerd.sh [--start-only]   (--start-only: leave a running dockerd alone)
set -euo pipefail
docker=/usr/bin/docker      # Debian's client; /usr/local/bin/docker may be an unrelated one
pidfile=/var/run/docker.pid
log=/var/log/dockerd.log
timeout=${DOCKERD_TIMEOUT:-60}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

alive() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

if [ "${1:-}" = --start-only ] && alive && "$docker" info >/dev/null 2>&1; then exit 0; fi
if alive; then
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 1 $((timeout * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "restart-dockerd.sh: dockerd $pid did not stop in ${timeout} s" >&2; exit 1
    fi
fi
# All three fds away from the caller: a caller reading our output through a pipe would
# otherwise wait for dockerd to exit.
setsid dockerd </dev/null >>"$log" 2>&1 &
for _ in $(seq 1 $((timeout * 5))); do
    if "$docker" info >/dev/null 2>&1; then
        echo "dockerd running (pid $(cat "$pidfile"))"; exit 0
    fi
    sleep 0.2
done
echo "restart-dockerd.sh: dockerd did not answer in ${timeout} s; last lines of $log:" >&2
tail -n 20 "$log" >&2
exit 1
