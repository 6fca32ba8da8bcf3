#!/bin/bash
# Runs inside the VM (chroot of the host's root, read-only; $2 read-write). See run.sh.
repo=$1 work=$2
set -x
export PATH=/usr/sbin:/usr/bin:/sbin:/bin PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev 2>/dev/null
# multiprocessing's semaphores (doctor's probes, torch) live in /dev/shm: without it SemLock fails with ENOENT
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
for d in /tmp /run /var/lib/nfs /mnt; do mount -t tmpfs tmpfs $d; done
mkdir -p /var/lib/nfs/{sm,sm.bak,v4recovery,rpc_pipefs} /mnt/a /mnt/b /run/export
touch /var/lib/nfs/{etab,rmtab,xtab}
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
mount -t nfsd nfsd /proc/fs/nfsd
mount -t rpc_pipefs rpc_pipefs /var/lib/nfs/rpc_pipefs
rpcbind -w; rpc.statd --no-notify
echo 10 >/proc/fs/nfsd/nfsv4leasetime; echo 10 >/proc/fs/nfsd/nfsv4gracetime; echo 10 >/proc/sys/fs/nfs/nlm_grace_period
mount -t tmpfs tmpfs /run/export
exportfs -o rw,no_root_squash,fsid=0,insecure,no_subtree_check 127.0.0.1:/run/export
rpc.mountd; rpc.nfsd 8
sleep 12  # the grace period
mount -t nfs -o vers=3 127.0.0.1:/run/export /mnt/a
mount -t nfs -o vers=3,nosharecache 127.0.0.1:/run/export /mnt/b
grep nfs /proc/mounts
py=$repo/.venv/bin/python
set +x
{
  echo "== mounts"; grep " nfs" /proc/mounts
  echo "== doctor /mnt/a --peer-mount /mnt/b"
  start=$(date +%s)
  $py -m fsdist doctor /mnt/a --peer-mount /mnt/b; echo "doctor rc=$? in $(( $(date +%s) - start )) s"
  echo "== 4 ranks, 0-1 through /mnt/a, 2-3 through /mnt/b"
  mkdir -p /mnt/a/job; chmod 700 /mnt/a/job
  start=$(date +%s)
  for r in 0 1 2 3; do
    d=/mnt/a/job; [ $r -ge 2 ] && d=/mnt/b/job
    timeout -s USR1 -k 30 900 $py "$repo/scripts/nfs-vm/ranks.py" $d $r 4 &
  done
  wait
  echo "ranks done in $(( $(date +%s) - start )) s; left in the directory: $(ls -A /mnt/a/job | tr '\n' ' ')"
} >"$work/result.raw" 2>&1
passes=$(grep -c "^rank [0-3] PASS" "$work/result.raw")
{ cat "$work/result.raw"; [ "$passes" = 4 ] && echo "RESULT PASS (NFS v3, two clients)" || echo "RESULT FAIL ($passes of 4 ranks passed)"; } >"$work/result.txt"
umount /mnt/a /mnt/b
