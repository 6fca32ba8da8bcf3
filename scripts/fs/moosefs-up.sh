#!/usr/bin/env bash
# Bring up MooseFS on this host from scratch: one master and one chunkserver in a network namespace of their own with
# their data under STATE_DIR, and four client mounts (two mounts behave like two client nodes):
#
#   scripts/fs/moosefs-up.sh STATE_DIR      then   scripts/fs/down.sh STATE_DIR
#
# STATE_DIR/safe/{A,B}:       mfsmount's defaults: POSIX and BSD locks go to the master;
# STATE_DIR/local-only/{A,B}: -o mfsnoposixlocks,mfsnobsdlocks: locks work within one mount only.
# Both see the same folder (fsdist-safe/, fsdist-local-only/ of the one filesystem).
# Installs moosefs-master/-chunkserver/-client with apt-get when missing (FSDIST_NO_APT=1 to
# forbid). Ports 9419-9422 (MFS_PORT_BASE moves them) inside that namespace. Root only (FUSE mounts).
set -euo pipefail
state=${1:?usage: moosefs-up.sh STATE_DIR}
[ "$(id -u)" = 0 ] || { echo "moosefs-up: needs root" >&2; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$state"
state=$(cd "$state" && pwd)
"$here/install.sh" "$state" apt mfsmaster:moosefs-master mfschunkserver:moosefs-chunkserver mfsmount:moosefs-client
base=${MFS_PORT_BASE:-9419}
# MooseFS refuses a master on 127.x ("use ip address of network controller"), and a test must not
# touch the host's network: its daemons live in a network namespace of their own whose loopback
# also carries 10.254.0.1. The FUSE mounts still land in this mount namespace.
ip_=10.254.0.1
trap 'echo "moosefs-up: failed; tearing down (logs in $state kept: $state.log)" >&2; cat "$state"/*.log >"$state.log" 2>/dev/null; "$here/down.sh" "$state"' ERR
mkdir -p "$state/master" "$state/chunks/hdd" "$state/chunkserver"
chmod 700 "$state/master" "$state/chunkserver" "$state/chunks"
cp /var/lib/mfs/metadata.mfs.empty "$state/master/metadata.mfs"
printf '* / rw,alldirs,maproot=0:0\n' >"$state/mfsexports.cfg"
printf '' >"$state/mfstopology.cfg"
cat >"$state/mfsmaster.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $state/master
EXPORTS_FILENAME = $state/mfsexports.cfg
TOPOLOGY_FILENAME = $state/mfstopology.cfg
MATOML_LISTEN_HOST = $ip_
MATOML_LISTEN_PORT = $base
MATOCS_LISTEN_HOST = $ip_
MATOCS_LISTEN_PORT = $((base + 1))
MATOCL_LISTEN_HOST = $ip_
MATOCL_LISTEN_PORT = $((base + 2))
CFG
printf '%s\n' "$state/chunks/hdd" >"$state/mfshdd.cfg"
cat >"$state/mfschunkserver.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $state/chunkserver
HDD_CONF_FILENAME = $state/mfshdd.cfg
HDD_LEAVE_SPACE_DEFAULT = 1GiB
MASTER_HOST = $ip_
MASTER_PORT = $((base + 1))
CSSERV_LISTEN_HOST = $ip_
CSSERV_LISTEN_PORT = $((base + 3))
CFG
unshare --net sh -c 'ip link set lo up && ip addr add '$ip_'/32 dev lo && exec sleep infinity' </dev/null >/dev/null 2>&1 &
echo $! >>"$state/pids"
for _ in $(seq 50); do nsenter --net=/proc/$!/ns/net ip -br addr show lo 2>/dev/null | grep -q "$ip_" && break; sleep 0.1; done
inside=(nsenter --net=/proc/$!/ns/net)
"${inside[@]}" mfsmaster -c "$state/mfsmaster.cfg" start >"$state/master.log" 2>&1
echo "mfsmaster -c $state/mfsmaster.cfg stop" >>"$state/stop"
"${inside[@]}" mfschunkserver -c "$state/mfschunkserver.cfg" start >"$state/chunkserver.log" 2>&1
echo "mfschunkserver -c $state/mfschunkserver.cfg stop" >>"$state/stop"
mkdir -p "$state/root"
"${inside[@]}" mfsmount -H $ip_ -P $((base + 2)) "$state/root" >"$state/mount.log" 2>&1
echo "$state/root" >>"$state/mounts"
# the chunkserver registers with the master a moment after it starts: until then writes fail ENOSPC
for try in $(seq 100); do
  if echo ok >"$state/root/.ready" 2>/dev/null && [ "$(cat "$state/root/.ready" 2>/dev/null)" = ok ]; then break; fi
  [ "$try" = 100 ] && { echo "moosefs-up: no chunkserver took a write within 20 s" >&2; false; }
  sleep 0.2
done
rm -f "$state/root/.ready"
for setting in safe local-only; do
  mkdir -p "$state/root/fsdist-$setting"
  opts=()
  [ "$setting" = local-only ] && opts=(-o mfsnoposixlocks,mfsnobsdlocks)
  for m in A B; do
    mkdir -p "$state/$setting/$m"
    "${inside[@]}" mfsmount -H $ip_ -P $((base + 2)) -S "/fsdist-$setting" "${opts[@]}" "$state/$setting/$m" >>"$state/mount.log" 2>&1
    echo "$state/$setting/$m" >>"$state/mounts"
  done
done
printf 'safe safe\nlocal-only local-only\n' >"$state/settings"
trap - ERR
echo "moosefs-up: MooseFS $(mfsmaster -v | sed -n 's/version: \([^ ]*\).*/\1/p') up in $state (safe/, local-only/)"
