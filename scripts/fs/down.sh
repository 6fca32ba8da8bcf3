#!/usr/bin/env bash
# Undo a scripts/fs/*-up.sh STATE_DIR: unmount what it mounted (last first), run the stop
# commands it recorded (last first), kill the daemons it recorded by pid, remove STATE_DIR.
# Safe to run twice, and after a half-finished bring-up.
set -uo pipefail
state=${1:?usage: down.sh STATE_DIR}
[ -d "$state" ] || exit 0
# a process stuck in a FUSE request (an open the daemon never answers) would keep the mount
# busy and cannot be killed: aborting the connection fails its request (fusectl: the folder is
# named after the mount's device minor)
if [ -f "$state/mounts" ]; then
  mountpoint -q /sys/fs/fuse/connections || mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null
  while read -r m; do
    if mountpoint -q "$m" && grep -qE "^[^ ]+ $m fuse" /proc/mounts; then
      minor=$(mountpoint -d "$m" | cut -d: -f2)
      [ -w "/sys/fs/fuse/connections/$minor/abort" ] && echo 1 >"/sys/fs/fuse/connections/$minor/abort"
    fi
  done <"$state/mounts"
  tac "$state/mounts" | while read -r m; do
    if grep -q " $m " /proc/mounts; then  # (mountpoint(1) fails on an aborted FUSE mount)
      umount "$m" 2>/dev/null || { sleep 0.5; umount "$m" 2>/dev/null; } || umount -l "$m"
    fi
  done
fi
if [ -f "$state/stop" ]; then
  tac "$state/stop" | while read -r command; do timeout 60 bash -c "$command" >/dev/null 2>&1; done
fi
if [ -f "$state/pids" ]; then
  while read -r pid; do kill "$pid" 2>/dev/null; done <"$state/pids"
  for _ in $(seq 50); do
    alive=0
    while read -r pid; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$state/pids"
    [ $alive = 0 ] && break
    sleep 0.1
  done
  while read -r pid; do kill -9 "$pid" 2>/dev/null; done <"$state/pids"
fi
# never follow into a mount that would not go away
if grep -qF " $state/" /proc/mounts; then
  echo "down: mounts under $state remain; not removing it" >&2
  exit 1
fi
rm -rf "$state"
