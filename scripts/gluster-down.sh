#!/usr/bin/env bash
# Undo scripts/gluster-up.sh STATE_DIR: unmount, stop and delete its volumes, stop its glusterd,
# remove STATE_DIR. Safe to run twice, and after a half-finished gluster-up.
set -uo pipefail
state=${1:?usage: gluster-down.sh STATE_DIR}
[ -d "$state" ] || exit 0
if [ -f "$state/mounts" ]; then
  while read -r m; do
    mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
  done <"$state/mounts"
fi
if [ -f "$state/volumes" ] && [ -f "$state/glusterd.pid" ]; then
  while read -r vol; do
    gluster --mode=script volume stop "$vol" force >/dev/null 2>&1
    gluster --mode=script volume delete "$vol" >/dev/null 2>&1
  done <"$state/volumes"
fi
if [ -f "$state/glusterd.pid" ]; then
  pid=$(cat "$state/glusterd.pid")
  kill "$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
fi
# brick daemons of our volumes (volume stop ends them; this catches a failed stop), by pid file
for pidfile in /var/run/gluster/vols/fsdist-*/*.pid; do
  [ -f "$pidfile" ] || continue
  while read -r vol; do
    case "$pidfile" in */"$vol"/*) kill -9 "$(cat "$pidfile")" 2>/dev/null; rm -f "$pidfile";; esac
  done <"$state/volumes" 2>/dev/null
done
if [ -f "$state/volumes" ]; then
  while read -r vol; do rm -rf "/var/lib/glusterd/vols/$vol"; done <"$state/volumes"
fi
rm -rf "$state"
