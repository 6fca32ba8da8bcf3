#!/bin/bash
# Runs inside the VM (chroot of the host's root, read-only; $2 read-write). See run.sh.
# One NFS server (a tmpfs), then the same check on NFS v3 and on NFS v4.2, each with two clients:
#   v3:   /mnt/a and /mnt/b over 127.0.0.1, the second with nosharecache (its own superblock)
#   v4.2: /mnt/a over 127.0.0.1; /mnt/b mounted from network namespace c2 over a veth pair,
#         with its own hostname, so the server sees a second client with its own identity
#         (one identity shared by both mounts would make them one client, with one cache)
# $3 (FSDIST_NFS_CHECK in run.sh): "all" = doctor, the 4-rank check, then the RPC count;
# "rpc" = only the RPC count (rpc_count.py: NFS RPCs per small all_reduce and per barrier per rank);
# "restart" = only the server restart (restart_ranks.py: checked all_reduces while nfsd restarts);
# "torn" = only the torn-read check (torn_ranks.py: writer through /mnt/a, reader through /mnt/b);
# "pages" = only which reads of a just-written file go to the server (page_cache.py);
# "ganesha" = only the NFS-Ganesha phases, which "all" runs too after the kernel's: a second,
# userspace server (FSAL VFS over its own tmpfs) in network namespace gsrv (10.8.0.2), mounted
# v3 (two mounts, the second nosharecache) and v4.2 (the second from c2), each with doctor, the
# 4-rank check, tests/test_filesystems.py (fs_suite) and the RPC count (flat)
# $5 (FSDIST_NFS_IO in run.sh): FSDIST_IO for every rank (auto, direct, locked)
# $6 (FSDIST_NFS_GANESHA in run.sh): the Ganesha phases' versions, "3,4.2" (default), "3" or "4.2"
repo=$1 work=$2 check=${3:-all} rpc_ops=${4:-200} io=${5:-auto} gvers=${6:-3,4.2}
set -x
export PATH=/usr/sbin:/usr/bin:/sbin:/bin PYTHONDONTWRITEBYTECODE=1 HOME=/tmp FSDIST_IO=$io
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev 2>/dev/null
# multiprocessing's semaphores (doctor's probes, torch) live in /dev/shm: without it SemLock fails with ENOENT
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
# the guest's own scratch folders; run.sh refuses a checkout or work folder under any of them
# (this tmpfs would hide it), so keep the two lists in step
for d in /tmp /run /var/lib/nfs /mnt; do mount -t tmpfs tmpfs $d; done
mkdir -p /var/lib/nfs/{sm,sm.bak,v4recovery,rpc_pipefs} /mnt/a /mnt/b /run/export /run/netns
touch /var/lib/nfs/{etab,rmtab,xtab}
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
hostname nfsvm
# the second v4 client's network: namespace c2 (10.9.0.2) reaching the server at 10.9.0.1
ip netns add c2
ip link add veth0 type veth peer name veth1
ip link set veth1 netns c2
ip addr add 10.9.0.1/24 dev veth0 && ip link set veth0 up
ip netns exec c2 sh -c 'ip link set lo up; ip addr add 10.9.0.2/24 dev veth1; ip link set veth1 up'
mount -t nfsd nfsd /proc/fs/nfsd
mount -t rpc_pipefs rpc_pipefs /var/lib/nfs/rpc_pipefs
rpcbind -w; rpc.statd --no-notify
echo 10 >/proc/fs/nfsd/nfsv4leasetime; echo 10 >/proc/fs/nfsd/nfsv4gracetime; echo 10 >/proc/sys/fs/nfs/nlm_grace_period
mount -t tmpfs tmpfs /run/export
for client in 127.0.0.1 10.9.0.0/24; do
  exportfs -o rw,no_root_squash,fsid=0,insecure,no_subtree_check "$client:/run/export"
done
rpc.mountd; rpc.nfsd 8
sleep 12  # the grace period
py=$repo/.venv/bin/python
# every RPC any client here starts, counted by procedure and program version (rpc_count.py reads
# the histogram): NLM's locks on v3 are RPCs of lockd, which the NFS mounts' own counters do not
# show. Not keyed by program name: two string keys (256 bytes each) overflow a histogram key, and
# the kernel refuses the trigger (EINVAL). Within the v3 phase, version 3 is NFS and 4 is NLM.
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
echo 'hist:keys=procname,version:size=4096' >/sys/kernel/tracing/events/sunrpc/rpc_request/trigger
set +x

# suite LABEL: doctor across the two mounts, then 4 ranks (0-1 through /mnt/a, 2-3 through /mnt/b)
suite() {
  echo "== $1: mounts"; grep " nfs" /proc/mounts
  echo "== $1: doctor /mnt/a --peer-mount /mnt/b"
  local start=$(date +%s)
  # a time limit: a doctor that found a call that never returns may itself block in one after
  # saying so (Ganesha v4.2), and the ranks should still run
  timeout -k 30 600 $py -m fsdist doctor /mnt/a --peer-mount /mnt/b; echo "doctor rc=$? in $(( $(date +%s) - start )) s"
  echo "== $1: 4 ranks, 0-1 through /mnt/a, 2-3 through /mnt/b"
  mkdir -p /mnt/a/job; chmod 700 /mnt/a/job
  start=$(date +%s)
  for r in 0 1 2 3; do
    d=/mnt/a/job; [ $r -ge 2 ] && d=/mnt/b/job
    timeout -s USR1 -k 30 900 $py "$repo/scripts/nfs-vm/ranks.py" $d $r 4 "$1" &
  done
  wait
  echo "ranks done in $(( $(date +%s) - start )) s; left in the directory: $(cd /mnt/a/job && find . -mindepth 1 | head -20 | tr '\n' ' ')"
  rm -rf /mnt/a/job
}

# rpc_suite LABEL [tiers]: 4 ranks as above count the NFS RPCs of small all_reduces, barriers,
# idle time, 2 ranks and large ops; "tiers": each mount's ranks are one node (FSDIST_NODE_ID =
# the client), so only the two leaders reach the server
rpc_suite() {
  local mode=${2:-flat} label=$1
  [ "$mode" = tiers ] && label="$1 two tiers"
  echo "== $label: RPC count, $rpc_ops ops per kind, ranks 0-1 through /mnt/a, 2-3 through /mnt/b"
  echo "/proc/net/rpc: $(ls /proc/net/rpc | tr '\n' ' ')"
  mkdir -p /mnt/a/rpcjob; chmod 700 /mnt/a/rpcjob
  local start=$(date +%s)
  for r in 0 1 2 3; do
    d=/mnt/a/rpcjob node=client-a; [ $r -ge 2 ] && d=/mnt/b/rpcjob node=client-b
    [ "$mode" = tiers ] || node=
    FSDIST_NODE_ID=$node timeout -s USR1 -k 30 900 $py "$repo/scripts/nfs-vm/rpc_count.py" $d $r 4 "$label" "$rpc_ops" 2 $mode &
  done
  wait
  echo "RPC count done in $(( $(date +%s) - start )) s"
  rm -rf /mnt/a/rpcjob
}

# restart_suite LABEL: 4 ranks run checked all_reduces while the NFS server restarts under them
# (hard mounts: the clients retry; v4 state and NLM locks are reclaimed in the grace period)
restart_suite() {
  echo "== $1: server restart, ranks 0-1 through /mnt/a, 2-3 through /mnt/b"
  mkdir -p /mnt/a/rsjob; chmod 700 /mnt/a/rsjob
  local start=$(date +%s) out=/run/restart.out
  : >$out
  for r in 0 1 2 3; do
    d=/mnt/a/rsjob; [ $r -ge 2 ] && d=/mnt/b/rsjob
    timeout -s USR1 -k 30 1200 $py "$repo/scripts/nfs-vm/restart_ranks.py" $d $r 4 "$1" 400 >>$out 2>&1 &
  done
  while [ "$(grep -c '^rank [0-3] ready' $out)" -lt 4 ] && [ $(( $(date +%s) - start )) -lt 900 ]; do sleep 1; done
  echo "ranks ready after $(( $(date +%s) - start )) s; restarting the NFS server (nfsd threads to 0, 5 s, then 8)"
  rpc.nfsd 0; sleep 5; rpc.nfsd 8
  echo "server back after $(( $(date +%s) - start )) s"
  wait
  grep -E "^rank [0-3] (PASS|FAIL)" $out
  echo "server-restart check done in $(( $(date +%s) - start )) s"
  rm -rf /mnt/a/rsjob
}

# torn_suite LABEL: direct records' torn reads, each region type, writer and reader on two clients
torn_suite() {
  echo "== $1: torn reads of direct records, writer through /mnt/a, reader through /mnt/b"
  mkdir -p /mnt/a/tornjob; chmod 700 /mnt/a/tornjob
  local start=$(date +%s)
  timeout -s USR1 -k 30 600 $py "$repo/scripts/nfs-vm/torn_ranks.py" /mnt/a/tornjob /mnt/b/tornjob 5 "$1"
  echo "torn-read check done in $(( $(date +%s) - start )) s"
  rm -rf /mnt/a/tornjob
}

# fs_suite LABEL: tests/test_filesystems.py (what `make test-fs` runs on the FUSE filesystems: the
# collective cases and 20 DDP steps across the two mounts, a rank SIGKILLed and the next job,
# bench locks --kind all across the mounts, bench --ranks 2) on these mounts, bind-mounted as
# its one setting; its doctor test is left out (suite ran doctor). Slow in this VM: the DDP
# case's imports alone take ~80 s, so each case may take 10 minutes
fs_suite() {
  local setting st=/run/fsstate start=$(date +%s)
  setting=$(echo "$1" | tr 'A-Z .' 'a-z--')
  echo "== $1: tests/test_filesystems.py, ranks 0-1 through /mnt/a, 2-3 through /mnt/b (setting $setting)"
  mkdir -p $st/$setting/A $st/$setting/B
  mount --bind /mnt/a $st/$setting/A && mount --bind /mnt/b $st/$setting/B
  echo "$setting safe" >$st/settings
  ( cd "$repo/tests" && FSDIST_FS=mounted FSDIST_FS_STATE=$st FSDIST_TEST_CASE_TIMEOUT=600 \
      timeout -k 30 3000 $py -m pytest -p no:cacheprovider -q -s -rA test_filesystems.py -k "not doctors_verdict" )
  echo "fs suite ($1) rc=$? in $(( $(date +%s) - start )) s"
  umount $st/$setting/A $st/$setting/B; rm -rf $st
}

checks() {
  case "$1" in *Ganesha*) suite "$1"; fs_suite "$1"; rpc_suite "$1"; return;; esac
  if [ "$check" = pages ]; then
    mkdir -p /mnt/a/pagejob && $py "$repo/scripts/nfs-vm/page_cache.py" /mnt/a/pagejob /mnt/b/pagejob "$1"
    rm -rf /mnt/a/pagejob; return
  fi
  if [ "$check" = restart ]; then restart_suite "$1"; return; fi
  if [ "$check" = torn ]; then torn_suite "$1"; return; fi
  [ "$check" = rpc ] || { suite "$1"; torn_suite "$1"; }
  rpc_suite "$1"
  rpc_suite "$1" tiers
}

# NFS-Ganesha, a userspace NFS server (FSAL VFS: file handles by name_to_handle_at, which tmpfs
# gives), in network namespace gsrv (10.8.0.2 over veth gveth0/gveth1) with its own rpcbind and
# statd, in a mount namespace with its own /run (rpcbind's socket). Ganesha is the NLM server
# itself: beside the kernel's lockd (the v3 clients' lock manager here, and nfsd's), lockd
# would take the one rpcbind's nlockmgr registration and the clients' locks would go to lockd.
# c2 reaches gsrv through the root namespace, which forwards. Kernel nfsd may keep running.
# lock_probe LABEL: one blocking fcntl lock through each mount, timed (NLM on v3 goes through statd)
lock_probe() {
  local m
  for m in /mnt/a /mnt/b; do
    timeout 120 $py -c 'import fcntl, os, sys, time
t = time.monotonic(); fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX); fcntl.lockf(fd, fcntl.LOCK_UN); r = "taken and released"
except OSError as e:
    r = f"refused: {e}"
print(f"lock probe ({sys.argv[2]}) {sys.argv[1]}: {r} in {time.monotonic() - t:.2f} s")' $m/lockprobe-${m#/mnt/} "$1" \
      || echo "lock probe ($1) $m: no answer in 120 s"
  done
}

ganesha_phases() {
  set -x
  echo "== NFS-Ganesha: $(dpkg-query -W -f '${Package} ${Version}, ' nfs-ganesha nfs-ganesha-vfs)"
  ip netns add gsrv
  ip link add gveth0 type veth peer name gveth1
  ip link set gveth1 netns gsrv
  ip addr add 10.8.0.1/24 dev gveth0 && ip link set gveth0 up
  # routes for c2 only, no default: a DNS query (statd looks the clients' names up) must fail at
  # once, not wait out its timeout, since Ganesha gives statd 3 s to answer before refusing the lock
  ip netns exec gsrv sh -c 'ip link set lo up; ip addr add 10.8.0.2/24 dev gveth1; ip link set gveth1 up; ip route add 10.9.0.0/24 via 10.8.0.1'
  ip netns exec c2 ip route add 10.8.0.0/24 via 10.9.0.1
  echo 1 >/proc/sys/net/ipv4/ip_forward
  mkdir -p /var/lib/nfs/gexport /var/lib/nfs/ganesha /var/lib/nfs/gstatd/sm /var/lib/nfs/gstatd/sm.bak
  mount -t tmpfs tmpfs /var/lib/nfs/gexport
  # the server side's names (bind-mounted over /etc/hosts in its mount namespace): statd answers
  # SM_MON from files, not DNS
  printf '127.0.0.1 localhost\n10.8.0.2 nfsvm-ganesha\n10.8.0.1 nfsvm\n10.9.0.2 nfsclient2\n' >/var/lib/nfs/ganesha-hosts
  cat >"$work/ganesha.conf" <<'CONF'
NFS_CORE_PARAM {
  Protocols = 3, 4;
  Enable_NLM = true;
  Enable_RQUOTA = false;
  Plugins_Dir = /usr/lib/x86_64-linux-gnu/ganesha;
}
NFSV4 {
  Minor_Versions = 0, 1, 2;
  Grace_Period = 10;
  Lease_Lifetime = 10;
  Only_Numeric_Owners = true;
  RecoveryRoot = /var/lib/nfs/ganesha;
}
NFS_KRB5 { Active_krb5 = false; }
LOG { COMPONENTS { NLM = DEBUG; } }
EXPORT {
  Export_Id = 1;
  Path = /var/lib/nfs/gexport;
  Pseudo = /export;
  Protocols = 3, 4;
  Access_Type = RW;
  Squash = no_root_squash;
  SecType = sys;
  FSAL { Name = VFS; }
}
CONF
  : >"$work/ganesha.log"
  # statd in the foreground with its debug log in the work folder (Ganesha's locks wait on it)
  nsenter --net=/run/netns/gsrv unshare -m sh -c "mount -t tmpfs tmpfs /run && mkdir -p /run/ganesha \
    && mount --bind /var/lib/nfs/ganesha-hosts /etc/hosts && rpcbind -w \
    && { rpc.statd -F -d --no-notify -P /var/lib/nfs/gstatd >$work/ganesha-statd.log 2>&1 & sleep 2; } \
    && ganesha.nfsd -L $work/ganesha.log -f $work/ganesha.conf -p /run/ganesha/ganesha.pid -N NIV_EVENT"
  local start=$(date +%s) label minor
  until rpcinfo -t 10.8.0.2 nfs 3 >/dev/null 2>&1 || [ $(( $(date +%s) - start )) -gt 120 ]; do sleep 1; done
  echo "ganesha answers after $(( $(date +%s) - start )) s"
  rpcinfo -p 10.8.0.2; showmount -e 10.8.0.2
  sleep 12  # its grace period (10 s)
  set +x
  # every 30 s, the kernel stack of each process stuck in an uninterruptible wait (an NFS call
  # that does not return), so a hang on this server shows where it is. Forked twice: the suites'
  # bare `wait` waits for every child of this shell, and would wait for this loop forever
  : >"$work/ganesha-stuck.log"
  ( ( while sleep 30; do
        for p in /proc/[0-9]*; do
          [ "$(awk '/^State:/ {print $2}' $p/status 2>/dev/null)" = D ] || continue
          echo "== $(date +%T) pid ${p#/proc/}: $(tr '\0' ' ' <$p/cmdline | cut -c1-160)"; cat $p/stack
        done
      done >>"$work/ganesha-stuck.log" 2>&1 ) & echo $! >/run/ganesha-watcher.pid )
  local watcher=$(cat /run/ganesha-watcher.pid)

  label="NFS v3 Ganesha"
  case ",$gvers," in *,3,*) ;; *) label=;; esac
  if [ -z "$label" ]; then :
  elif timeout 120 mount -t nfs -o vers=3 10.8.0.2:/var/lib/nfs/gexport /mnt/a \
     && timeout 120 mount -t nfs -o vers=3,nosharecache 10.8.0.2:/var/lib/nfs/gexport /mnt/b; then
    lock_probe "$label" >>"$work/result.raw" 2>&1
    checks "$label" >>"$work/result.raw" 2>&1
  else
    echo "RESULT FAIL ($label, mount: see guest.log)" >>"$work/result.raw"
  fi
  [ -z "$label" ] || { timeout 60 umount /mnt/a /mnt/b; versions+=("$label"); }
  case ",$gvers," in *,4.2,*) ;; *) kill $watcher; return;; esac

  # v4.2 if this Ganesha serves it, else v4.1
  for minor in 4.2 4.1 none; do
    [ $minor = none ] || timeout 120 mount -t nfs -o vers=$minor 10.8.0.2:/export /mnt/a && break
  done
  label="NFS v$minor Ganesha"
  if [ $minor != none ] && timeout 120 nsenter --net=/run/netns/c2 unshare -u sh -c \
       "hostname nfsclient2; mount -t nfs -o vers=$minor 10.8.0.2:/export /mnt/b"; then
    lock_probe "$label" >>"$work/result.raw" 2>&1
    checks "$label" >>"$work/result.raw" 2>&1
  else
    echo "RESULT FAIL ($label, mount: see guest.log)" >>"$work/result.raw"
  fi
  timeout 60 umount /mnt/a /mnt/b
  versions+=("$label")
  kill $watcher
  echo "== NFS-Ganesha phases done in $(( $(date +%s) - start )) s"
}

: >"$work/result.raw"
versions=()
if [ "$check" != ganesha ]; then
mount -t nfs -o vers=3 127.0.0.1:/run/export /mnt/a
mount -t nfs -o vers=3,nosharecache 127.0.0.1:/run/export /mnt/b
checks "NFS v3" >>"$work/result.raw" 2>&1
umount /mnt/a /mnt/b
versions+=("NFS v3")

mount -t nfs -o vers=4.2 127.0.0.1:/ /mnt/a
# nsenter --net: only the network namespace changes, so the mount lands in the one mount
# namespace every rank sees (ip netns exec would make a private one); unshare -u: own hostname
nsenter --net=/run/netns/c2 unshare -u sh -c 'hostname nfsclient2; mount -t nfs -o vers=4.2 10.9.0.1:/ /mnt/b'
checks "NFS v4.2" >>"$work/result.raw" 2>&1
umount /mnt/a /mnt/b
versions+=("NFS v4.2")
fi

if [ "$check" = all ] || [ "$check" = ganesha ]; then
  ganesha_phases
fi

{
  cat "$work/result.raw"
  for v in "${versions[@]}"; do
    case "$v" in *Ganesha*)
      grep -q "^RESULT FAIL ($v, mount" "$work/result.raw" && continue
      passes=$(grep -c "^rank [0-3] PASS ($v)" "$work/result.raw")
      [ "$passes" = 4 ] && echo "RESULT PASS ($v, two clients)" || echo "RESULT FAIL ($v: $passes of 4 ranks passed)"
      passes=$(grep -c "^rank [0-3] PASS ($v, RPC count)" "$work/result.raw")
      [ "$passes" = 4 ] && echo "RESULT PASS ($v, RPC count)" || echo "RESULT FAIL ($v, RPC count: $passes of 4 ranks passed)"
      grep -q "^fs suite ($v) rc=0 " "$work/result.raw" && echo "RESULT PASS ($v, tests/test_filesystems.py)" \
        || echo "RESULT FAIL ($v, tests/test_filesystems.py: $(grep "^fs suite ($v)" "$work/result.raw"))"
      continue;;
    esac
    if [ "$check" = pages ]; then
      renamed=$(grep "^pages ($v) written temp + rename, read by the same client, pread:" "$work/result.raw" | awk '{print $(NF-6)}')
      in_place=$(grep "^pages ($v) written in place, read by the same client, pread:" "$work/result.raw" | awk '{print $(NF-6)}')
      awk -v r="$renamed" -v p="$in_place" 'BEGIN { exit !(r != "" && p != "" && p + 0 < r + 0) }' \
        && echo "RESULT PASS ($v, pages: its writer's client fetched $in_place of a file written in place, $renamed of one renamed)" \
        || echo "RESULT FAIL ($v, pages: its writer's client fetched ${in_place:-?} of a file written in place, ${renamed:-?} of one renamed)"
      continue
    fi
    if [ "$check" = restart ]; then
      passes=$(grep -c "^rank [0-3] PASS ($v, server restart)" "$work/result.raw")
      wrong=$(grep -c "^rank [0-3] FAIL WrongResultError" "$work/result.raw")
      [ "$wrong" = 0 ] || echo "RESULT FAIL ($v, server restart: a wrong result)"
      [ "$passes" = 4 ] && echo "RESULT PASS ($v, server restart: completed, correct)" \
        || echo "RESULT NOTE ($v, server restart: $passes of 4 ranks completed; the others failed with the errors above)"
      continue
    fi
    if [ "$check" = all ] || [ "$check" = torn ]; then
      passes=$(grep -c "^torn .* PASS ($v)" "$work/result.raw")
      [ "$passes" = 5 ] && echo "RESULT PASS ($v, torn reads)" || echo "RESULT FAIL ($v, torn reads: $passes of 5 checks passed)"
      [ "$check" = torn ] && continue
    fi
    if [ "$check" != rpc ]; then
      passes=$(grep -c "^rank [0-3] PASS ($v)" "$work/result.raw")
      [ "$passes" = 4 ] && echo "RESULT PASS ($v, two clients)" || echo "RESULT FAIL ($v: $passes of 4 ranks passed)"
    fi
    for kind in "$v" "$v two tiers"; do
      passes=$(grep -c "^rank [0-3] PASS ($kind, RPC count)" "$work/result.raw")
      [ "$passes" = 4 ] && echo "RESULT PASS ($kind, RPC count)" || echo "RESULT FAIL ($kind, RPC count: $passes of 4 ranks passed)"
    done
  done
  if [ "$check" = all ] || [ "$check" = rpc ] || [ "$check" = ganesha ]; then
    echo "== RPCs per op (per second when idle) per rank, by type"
    $py "$repo/scripts/nfs-vm/mountstats.py" summary "$work/result.raw"
  fi
} >"$work/result.txt"
