#!/usr/bin/env bash
# make test-nfs: fsdist on kernel NFS v3 and v4.2, inside a QEMU VM (this host's kernel has no NFS client).
# Root only. Installs qemu-system-x86, busybox-static and nfs-kernel-server if missing, fetches a
# Debian kernel image, builds an initramfs whose /init mounts this host's root read-only over 9p
# (so the VM runs this checkout's .venv) and a work folder read-write, then runs guest.sh there:
# an NFS server exporting a tmpfs, mounted twice as two clients (v3: the second with
# nosharecache; v4.2: the second from its own network namespace and hostname), doctor across
# the two mounts, and ranks split across them, once per version.
# Then, on each version, the RPC count (rpc_count.py): the NFS RPCs per small all_reduce, per
# barrier and per idle second per rank, by type, from the client's own counters.
# FSDIST_NFS_CHECK=rpc runs only the RPC count (no doctor, no 4-rank check, no DDP);
# FSDIST_NFS_RPC_OPS sets the ops per measured loop (default 200). FSDIST_NFS_IO=direct|locked sets
# FSDIST_IO for every rank in the VM (default auto). FSDIST_NFS_CHECK=restart runs
# only the server restart: 4 ranks' checked all_reduces while the NFS server restarts under them
# (restart_ranks.py); the job must complete with correct results or fail with a clear error.
# FSDIST_NFS_CHECK=torn runs only the torn-read check (torn_ranks.py: each region type of direct
# records, a reader on one client racing its writer on the other; a writer cut off mid-record),
# which every full run makes too. FSDIST_NFS_CHECK=pages runs only page_cache.py: which reads of a
# just-written message file go to the server, written by rename or in place (why message files
# are written in place on network filesystems). FSDIST_NFS_CHECK=ganesha runs only the NFS-Ganesha
# phases, which every full run makes too, after the kernel's: a userspace NFS server (nfs-ganesha,
# FSAL VFS over a tmpfs) in its own network namespace, mounted v3 (two mounts) and v4.2 (the second
# from its own namespace), each with doctor, the 4-rank check, tests/test_filesystems.py (what
# make test-fs runs: collectives and DDP, kill-and-restart, bench locks, bench) and the RPC count;
# FSDIST_NFS_GANESHA=3 or 4.2 runs only that version's Ganesha phase.
# Result: the work folder's result.txt (also printed). Under software emulation, on a quiet host:
# ~25 minutes for the kernel server, ~55 more for Ganesha (FSDIST_NFS_CHECK=ganesha alone: 53), RPC count only 11-15.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/var/tmp/fsdist-nfs-vm}
mkdir -p "$work"; work=$(cd "$work" && pwd)
# the guest mounts its own tmpfs over these (guest.sh): a checkout or work folder under one of
# them would vanish inside the VM, and every rank fail with "No such file" after a full boot
for path in "$repo" "$work"; do
  for hidden in /tmp /run /var/lib/nfs /mnt; do
    case "$path/" in "$hidden"/*)
      echo "test-nfs: $path is under $hidden, which the VM covers with its own tmpfs, so it would not see" \
           "it. Clone the checkout (and pass a work folder, default /var/tmp/fsdist-nfs-vm) elsewhere," \
           "e.g. under /var/tmp or \$HOME" >&2
      exit 2;;
    esac
  done
done
check=${FSDIST_NFS_CHECK:-all} rpc_ops=${FSDIST_NFS_RPC_OPS:-200} io=${FSDIST_NFS_IO:-auto} gvers=${FSDIST_NFS_GANESHA:-3,4.2}
case "$gvers" in 3,4.2|3|4.2) ;; *) echo "test-nfs: FSDIST_NFS_GANESHA is 3,4.2 (default), 3 or 4.2, not '$gvers'" >&2; exit 2;; esac
case "$check" in all|rpc|restart|torn|pages|ganesha) ;; *) echo "test-nfs: FSDIST_NFS_CHECK is all (default), rpc, restart, torn, pages or ganesha, not '$check'" >&2; exit 2;; esac
case "$io" in auto|direct|locked) ;; *) echo "test-nfs: FSDIST_NFS_IO is auto (default), direct or locked, not '$io'" >&2; exit 2;; esac
case "$rpc_ops" in ''|*[!0-9]*) echo "test-nfs: FSDIST_NFS_RPC_OPS must be a number, not '$rpc_ops'" >&2; exit 2;; esac
[ "$(id -u)" = 0 ] || { echo "test-nfs: needs root" >&2; exit 77; }
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v rpc.nfsd >/dev/null || need+=(nfs-kernel-server)
command -v ganesha.nfsd >/dev/null || need+=(nfs-ganesha)
[ -e /usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so ] || need+=(nfs-ganesha-vfs)
# qemu: the VM; busybox-static: the initramfs; nfs-kernel-server: rpcbind/statd/mountd/nfsd run in the guest;
# nfs-ganesha(-vfs): the second, userspace NFS server (only the ganesha phases start it)
[ ${#need[@]} = 0 ] || apt-get install -y -q --no-install-recommends "${need[@]}" >"$work/apt.log"
kver=${FSDIST_NFS_KERNEL:-6.1.0-50-amd64}
if [ ! -d "$work/k/lib/modules/$kver" ]; then
  (cd "$work" && apt-get download "linux-image-$kver" >/dev/null 2>&1 && dpkg -x linux-image-"$kver"_*.deb k)
fi
rm -rf "$work/initrd" && mkdir -p "$work/initrd"/{bin,mods,proc,sys,dev,host}
cp /bin/busybox "$work/initrd/bin/"
python3 "$repo/scripts/nfs-vm/modorder.py" "$work/k/lib/modules/$kver" virtio_pci 9pnet_virtio 9p nfsv3 nfsv4 nfsd veth \
  | while read -r ko; do cp "$ko" "$work/initrd/mods/"; basename "$ko"; done >"$work/initrd/mods/order"
cat >"$work/initrd/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for pass in 1 2; do for m in \$(cat /mods/order); do insmod /mods/\$m 2>/dev/null; done; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288 hostroot /host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 share /host$work
chroot /host /bin/bash $repo/scripts/nfs-vm/guest.sh $repo $work $check $rpc_ops $io $gvers > /host$work/guest.log 2>&1
sync; poweroff -f
INIT
chmod +x "$work/initrd/init"
(cd "$work/initrd" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$work/initrd.gz")
rm -f "$work/result.txt"
# the VM's time limit: a full run, or Ganesha's phases with tests/test_filesystems.py, take longer
case "$check" in all|ganesha) limit=6000;; *) limit=2400;; esac
timeout "${FSDIST_NFS_TIMEOUT:-$limit}" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m 3G -smp 2 -nographic -no-reboot \
  -kernel "$work/k/boot/vmlinuz-$kver" -initrd "$work/initrd.gz" \
  -append "console=ttyS0 rdinit=/init panic=-1 quiet" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$work,mount_tag=share,security_model=none" -nic none >"$work/console.log" 2>&1 || true
cat "$work/guest.log" 2>/dev/null | tail -40
[ -f "$work/result.txt" ] && cat "$work/result.txt" && ! grep -q "^RESULT FAIL" "$work/result.txt" && grep -q "^RESULT PASS" "$work/result.txt"
