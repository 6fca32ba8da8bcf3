#!/usr/bin/env bash
# Bring up GlusterFS on this host from scratch: one glusterd, two single-brick volumes, each
# mounted twice (two mounts behave like two client nodes). Root only.
#
#   scripts/gluster-up.sh STATE_DIR      then   scripts/gluster-down.sh STATE_DIR
#
# STATE_DIR/strict/{A,B}: volume with client-side caches off, mounted with zero timeouts and
#                         direct I/O (lock-coherent: see docs/filesystems.md);
# STATE_DIR/default/{A,B}: Gluster's default volume options and mount options.
# Installs glusterfs-server/-client with apt-get when missing (FSDIST_NO_APT=1 to forbid).
# Everything it starts is recorded under STATE_DIR, so gluster-down.sh stops exactly that.
set -euo pipefail
state=${1:?usage: gluster-up.sh STATE_DIR}
mkdir -p "$state"
state=$(cd "$state" && pwd)
[ "$(id -u)" = 0 ] || { echo "gluster-up: needs root" >&2; exit 77; }
if ! command -v glusterd >/dev/null || ! command -v mount.glusterfs >/dev/null; then
  [ "${FSDIST_NO_APT:-0}" = 1 ] && { echo "gluster-up: glusterfs not installed" >&2; exit 77; }
  # glusterfs-server: glusterd and the brick daemon; glusterfs-client: mount.glusterfs (FUSE client)
  (apt-get install -y -q glusterfs-server glusterfs-client || { apt-get update -q && apt-get install -y -q glusterfs-server glusterfs-client; }) >"$state/apt.log" 2>&1 \
    || { echo "gluster-up: apt-get install glusterfs failed (see $state/apt.log)" >&2; exit 77; }
fi
if pgrep -x glusterd >/dev/null; then
  echo "gluster-up: a glusterd is already running on this host; not sharing it" >&2; exit 1
fi
host=$(hostname)   # gluster refuses 127.0.0.1/localhost as a brick host
trap 'echo "gluster-up: failed; tearing down" >&2; "$(dirname "$0")/gluster-down.sh" "$state"' ERR
glusterd -p "$state/glusterd.pid" --log-file="$state/glusterd.log"
for _ in $(seq 100); do gluster --mode=script peer status >/dev/null 2>&1 && break; sleep 0.1; done
id=$$
for mode in strict default; do
  vol="fsdist-$id-$mode"
  echo "$vol" >>"$state/volumes"
  mkdir -p "$state/$mode/brick" "$state/$mode/A" "$state/$mode/B"
  gluster --mode=script volume create "$vol" "$host:$state/$mode/brick" force >/dev/null
  opts=()
  if [ "$mode" = strict ]; then
    for o in quick-read io-cache read-ahead stat-prefetch open-behind readdir-ahead write-behind; do
      gluster --mode=script volume set "$vol" "performance.$o" off >/dev/null
    done
    opts=(-o attribute-timeout=0,entry-timeout=0,negative-timeout=0,direct-io-mode=enable)
  fi
  gluster --mode=script volume start "$vol" >/dev/null
  for m in A B; do
    for try in $(seq 50); do
      mount -t glusterfs "${opts[@]}" "$host:/$vol" "$state/$mode/$m" 2>/dev/null && break
      [ "$try" = 50 ] && { echo "gluster-up: could not mount $vol" >&2; false; }
      sleep 0.2
    done
    echo "$state/$mode/$m" >>"$state/mounts"
  done
done
trap - ERR
echo "gluster-up: volumes up in $state: $(tr '\n' ' ' <"$state/volumes")"
