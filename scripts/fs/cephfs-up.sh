#!/usr/bin/env bash
# Bring up CephFS on this host from scratch: a one-machine cluster (one monitor, one manager, one
# OSD whose store is a memstore of CEPH_OSD_BYTES (default 1 GiB of RAM), one MDS, pools of size
# 1) in a network namespace of its own, and four ceph-fuse mounts (two mounts behave like two
# clients; each mount is a client of its own, client.fsdist-<setting>-<A|B>):
#
#   scripts/fs/cephfs-up.sh STATE_DIR      then   scripts/fs/down.sh STATE_DIR
#
# STATE_DIR/safe/{A,B}:    --fuse_disable_pagecache=true: no kernel page cache, every read goes
#                          to ceph-fuse (and its client cache, which the MDS keeps coherent);
# STATE_DIR/default/{A,B}: ceph-fuse's defaults: locks go to the MDS and exclude across clients,
#                          but a read through a held-open descriptor can come from the kernel's
#                          page cache, seconds old (measured: unsafe, docs/filesystems.md).
# Each setting sees a folder of its own of the one filesystem (/fsdist-safe, /fsdist-default).
# ceph-fuse has no option that keeps locks inside one mount (no local-only setting). The kernel
# client (mount -t ceph) needs the ceph module: where /proc/filesystems lists it, add it.
# No cephx (auth none): the cluster listens only inside its own network namespace, which only
# root can enter, and the mounts run as root anyway; keys would add steps and protect nothing.
# Installs ceph-mon/-osd/-mds/-mgr/-fuse with apt-get when missing (FSDIST_NO_APT=1 to forbid;
# Debian 12: 16.2, 55 MB to fetch, 247 MB installed). Runs no systemd unit: every daemon runs in
# the foreground, by pid in STATE_DIR/pids. Root only (FUSE mounts).
set -euo pipefail
state=${1:?usage: cephfs-up.sh STATE_DIR}
[ "$(id -u)" = 0 ] || { echo "cephfs-up: needs root" >&2; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$state"
state=$(cd "$state" && pwd)
"$here/install.sh" "$state" apt --no-install-recommends ceph-mon:ceph-mon ceph-osd:ceph-osd ceph-mds:ceph-mds \
  ceph-mgr:ceph-mgr ceph-fuse:ceph-fuse
# a monitor's address is in every map it hands out: give it one of its own (not 127.x, which
# would also be every other namespace's) in a network namespace whose ports touch nothing of the host's
ip_=10.254.0.2
trap 'echo "cephfs-up: failed; tearing down (logs: $state.log)" >&2; cat "$state"/log/*.log "$state"/*.log >"$state.log" 2>/dev/null; "$here/down.sh" "$state"' ERR
unshare --net sh -c 'ip link set lo up && ip addr add '$ip_'/32 dev lo && exec sleep infinity' </dev/null >/dev/null 2>&1 &
echo $! >>"$state/pids"
for _ in $(seq 50); do nsenter --net=/proc/$!/ns/net ip -br addr show lo 2>/dev/null | grep -q "$ip_" && break; sleep 0.1; done
inside=(nsenter --net=/proc/$!/ns/net)
conf=$state/ceph.conf
mkdir -p "$state/run" "$state/log" "$state/mon/a" "$state/osd/0" "$state/mds/a" "$state/mgr/x"
chmod 700 "$state/run" "$state/log" "$state/mon" "$state/osd" "$state/mds" "$state/mgr"
fsid=$(uuidgen)
cat >"$conf" <<CFG
[global]
fsid = $fsid
mon_host = [v2:$ip_:3300,v1:$ip_:6789]
public_addr = $ip_
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
run_dir = $state/run
admin_socket = $state/run/\$name.asok
log_file = $state/log/\$name.log
crash_dir = $state/log/crash
mon_data = $state/mon/\$id
osd_data = $state/osd/\$id
mds_data = $state/mds/\$id
mgr_data = $state/mgr/\$id
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 5
osd_crush_chooseleaf_type = 0
osd_objectstore = memstore
memstore_device_bytes = ${CEPH_OSD_BYTES:-1073741824}
osd_memory_target = 1073741824
mgr_initial_modules =
# with the default 5 s MDS tick, metadata requests in a run directory used through both mounts
# (lookups, creates, unlinks, renames) sat in the MDS 3-5 s each, on the tick's beat: 33-44 s
# stalls in a 1 MiB all_reduce across the mounts; 0.5 s cut 30 of them from 110 s to 12 s
mds_tick_interval = 0.5
[client]
log_file = $state/log/\$name.\$pid.log
CFG
ceph=("${inside[@]}" timeout 60 ceph -c "$conf")
monmaptool --create --fsid "$fsid" --addv a "[v2:$ip_:3300,v1:$ip_:6789]" "$state/monmap" >"$state/setup.log" 2>&1
ceph-mon -c "$conf" -i a --mkfs --monmap "$state/monmap" >>"$state/setup.log" 2>&1
"${inside[@]}" ceph-mon -c "$conf" -i a -f >"$state/log/mon.out" 2>&1 &
echo $! >>"$state/pids"
"${ceph[@]}" status >>"$state/setup.log" 2>&1
"${inside[@]}" ceph-mgr -c "$conf" -i x -f >"$state/log/mgr.out" 2>&1 &
echo $! >>"$state/pids"
uuid=$(uuidgen)
osd=$("${ceph[@]}" osd new "$uuid" 2>>"$state/setup.log")
[ "$osd" = 0 ] || { echo "cephfs-up: 'ceph osd new' said '$osd', not 0" >&2; false; }
"${inside[@]}" timeout 120 ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$uuid" >>"$state/setup.log" 2>&1
"${inside[@]}" ceph-osd -c "$conf" -i 0 -f >"$state/log/osd.out" 2>&1 &
echo $! >>"$state/pids"
"${inside[@]}" ceph-mds -c "$conf" -i a -f >"$state/log/mds.out" 2>&1 &
echo $! >>"$state/pids"
"${ceph[@]}" osd pool create cephfs_metadata 8 >>"$state/setup.log" 2>&1
"${ceph[@]}" osd pool create cephfs_data 8 >>"$state/setup.log" 2>&1
"${ceph[@]}" fs new cephfs cephfs_metadata cephfs_data >>"$state/setup.log" 2>&1
end=$((SECONDS + 120))
until "${ceph[@]}" mds stat 2>/dev/null | grep -q 'up:active'; do
  [ $SECONDS -lt $end ] || { echo "cephfs-up: no MDS active within 120 s" >&2; false; }
  sleep 0.5
done
# one mount of the whole tree, only to make the folder the clients mount
mount_() {  # mount_ NAME FOLDER MOUNTPOINT [OPTION ...]
  "${inside[@]}" ceph-fuse -c "$conf" --id "$1" -r "$2" -f "$3" "${@:4}" >"$state/log/fuse-$1.out" 2>&1 &
  echo $! >>"$state/pids"
  echo "$3" >>"$state/mounts"
  for try in $(seq 300); do
    mountpoint -q "$3" && return 0
    [ "$try" = 300 ] && { echo "cephfs-up: $3 not mounted within 60 s" >&2; return 1; }
    sleep 0.2
  done
}
mkdir -p "$state/root"
mount_ fsdist-root / "$state/root"
mkdir -p "$state/root/fsdist-safe" "$state/root/fsdist-default"
umount "$state/root"
for setting in safe default; do
  opts=()
  [ "$setting" = safe ] && opts=(--fuse_disable_pagecache=true)
  for m in A B; do
    mkdir -p "$state/$setting/$m"
    mount_ "fsdist-$setting-$m" "/fsdist-$setting" "$state/$setting/$m" "${opts[@]}"
  done
done
printf 'safe safe\ndefault unsafe\n' >"$state/settings"
trap - ERR
echo "cephfs-up: CephFS $(ceph-mon --version | awk '{print $3}') up in $state (safe/, default/)"
