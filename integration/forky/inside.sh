#!/usr/bin/env bash
# Inside the forky root (run.sh starts it through in-forky.sh): install gpuckpt as an operator on
# Debian forky would (packaging/install.sh with forky's python3, `gpuckpt install --engine podman
# --default`, `gpuckpt install --engine docker`, `gpuckpt doctor`), start the root's own dockerd 28
# (dockerd.sh), then run the engine tests of podman, runc, crun, CRIU and docker 28. Without a
# network: pip installs from the wheels forky-root.sh fetched.
set -euo pipefail
cd /src/gpuckpt
# The CI machine's cgroup v1 makes podman 5 warn on every command's stderr; operators of podman 5
# run cgroup v2. The tests read the tools' stderr.
export PODMAN_IGNORE_CGROUPSV1_WARNING=1
# Every run starts where a new operator starts: no gpuckpt, no configuration, trust policy or
# node key, no containers (a run stopped part-way leaves them behind; the root is kept between
# runs only to save the download). podman's images stay.
podman rm -a -f -t 0 >/dev/null 2>&1 || true
rm -rf /opt/gpuckpt /etc/gpuckpt /run/gpuckpt /usr/local/bin/gpuckpt /usr/local/bin/gpuckpt-runtime \
       /etc/containers/containers.conf /etc/criu /etc/docker/daemon.json
PIP_NO_INDEX=1 PIP_FIND_LINKS=/var/cache/gpuckpt-wheels GPUCKPT_EXTRAS=gpu,test bash packaging/install.sh
gpuckpt install --engine podman --default
gpuckpt install --engine docker
bash integration/forky/dockerd.sh
gpuckpt doctor
image=localhost/gpuckpt-test:latest
podman image exists "$image" ||
    podman import --quiet --change 'CMD ["/bin/sh"]' /var/cache/gpuckpt-testbed/rootfs-python.tar "$image" >/dev/null
echo "forky engine set: $(. /etc/os-release && echo "$PRETTY_NAME"), $(podman --version), $(runc --version | head -n1)," \
     "$(crun --version | head -n1), CRIU $(criu --version | sed -n 's/^Version: //p'), $(python3 --version)," \
     "$(docker version --format 'docker {{.Server.Version}}')"
# The README's demo, its container steps (its setup is Debian 12's; the operator's install above is forky's)
bash integration/demo-steps.sh
# docker 28's tests are forky/test_docker28.py. Not here: test_docker.py (docker 20.10's, the Debian
# 12 set's) and test_image_creds.py, whose
# workload escapes through a cgroup v1 release_agent: the kernel runs the agent in the host's
# namespaces, which no isolated root can hold (its path is the forky root's, so the escape it
# must see first fails there), and the named cgroup hierarchy it mounts is the whole machine's.
tests=(integration/test_podman.py integration/test_archives.py integration/test_runc_level.py
       integration/test_link_remap.py integration/test_leave_running_shm.py integration/test_tcp.py integration/test_registry.py
       integration/test_signed_moves.py integration/test_archive_content.py integration/test_podman_network.py
       integration/forky/test_docker28.py)
for arg in "$@"; do
    case $arg in integration/*) tests=();; esac    # test files named: only those
done
export PYTHONPATH=/src/gpuckpt/integration/forky   # the plugin below (the launchers run with -I)
exec /opt/gpuckpt/venv/bin/python3 -m pytest -p no:cacheprovider -p forky_expectations "${tests[@]}" "$@"
