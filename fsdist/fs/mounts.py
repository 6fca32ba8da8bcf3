"""What filesystem a directory is on (the mount table itself: files/mountinfo.py).

The lowest layer of ``fs/``: which mount a path lies on, what users call its filesystem, whether
it is local to this machine, and which client reaches it. What a mount's type and options mean
for fsdist's safety is ``fs/hazards.py`` (FUSE kinds: ``fs/fuse_kinds.py``); both return the
``Finding`` defined here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..files.mountinfo import Mount, find_mount, read_mounts

__all__ = [
    "LOCAL_FILESYSTEMS",
    "OK",
    "UNSAFE",
    "WARN",
    "Finding",
    "Mount",
    "client_key",
    "describe_filesystem",
    "filesystem_name",
    "find_mount",
    "is_local",
    "read_mounts",
]

#: Filesystems whose files live on this machine only: a rewritten file cannot be served from
#: another client's stale cache, so retired message files may be reused (see transport).
LOCAL_FILESYSTEMS = frozenset(
    {"tmpfs", "ramfs", "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "overlay", "zfs", "bcachefs"}
)

#: a Finding's verdicts
OK, WARN, UNSAFE = "ok", "warn", "unsafe"


@dataclass(frozen=True)
class Finding:
    """One property of the filesystem: its verdict, what was found, and how to fix it."""

    name: str
    verdict: str  # OK, WARN or UNSAFE
    detail: str
    fix: str = ""
    #: UNSAFE even for ranks that all reach the filesystem through this one mount (not only
    #: across clients): a multi-rank job is refused even on one machine
    within_one_mount: bool = False


#: what users call a filesystem, by mount type (FUSE ones by subtype)
_NAMES = {
    "nfs": "NFS", "nfs4": "NFS", "lustre": "Lustre", "gpfs": "GPFS", "ceph": "CephFS", "fuse.ceph-fuse": "CephFS",
    "fuse.ceph": "CephFS", "fuse.glusterfs": "GlusterFS", "fuse.juicefs": "JuiceFS", "fuse.seaweedfs": "SeaweedFS",
    "beegfs": "BeeGFS",
}  # fmt: skip


def filesystem_name(mount: Mount) -> str:
    """The filesystem's own name where known ("MooseFS" mounts as plain ``fuse``), else its type."""
    if mount.source.startswith("mfs#"):
        return "MooseFS"
    return _NAMES.get(mount.fstype, mount.fstype)


def describe_filesystem(path: str) -> str:
    """``path``'s filesystem for a message: "MooseFS (fuse at /mnt/a, from mfs#host:9421)"."""
    try:
        mount = find_mount(path)
    except OSError:
        return "an unknown filesystem"
    return f"{filesystem_name(mount)} ({mount.fstype} at {mount.mount_point}, from {mount.source})"


def is_local(path: str) -> bool:
    """Whether ``path`` lies on a filesystem of this machine alone (False when unknown)."""
    try:
        return find_mount(path).fstype in LOCAL_FILESYSTEMS
    except OSError:
        return False


def client_key(path: str) -> str:
    """Equal for two processes exactly when they reach ``path`` through the same client:
    the same kernel (boot id) and the same mounted device."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
    except OSError:
        boot_id = os.uname().nodename
    return f"{boot_id}:{os.stat(path).st_dev}"
