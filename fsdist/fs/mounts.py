"""What filesystem a directory is on: the mount table, read from ``/proc/self/mountinfo``.

The lowest layer of ``fs/``: which mount a path lies on, what users call its filesystem, whether
it is local to this machine, and which client reaches it. What a mount's type and options mean
for fsdist's safety is ``fs/hazards.py`` (FUSE kinds: ``fs/fuse_kinds.py``); both return the
``Finding`` defined here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

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
]

#: Filesystems whose files live on this machine only: a rewritten file cannot be served from
#: another client's stale cache, so retired message files may be reused (see transport).
LOCAL_FILESYSTEMS = frozenset(
    {"tmpfs", "ramfs", "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "overlay", "zfs", "bcachefs"}
)

#: a Finding's verdicts
OK, WARN, UNSAFE = "ok", "warn", "unsafe"


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo``: the mount a path lies on."""

    mount_point: str
    fstype: str  # "nfs4", "lustre", "fuse.glusterfs", "fuse" (bindfs shows no subtype), ...
    source: str
    options: dict[str, str] = field(default_factory=dict)  # per-mount and superblock; flags map to ""
    device: str = ""  # major:minor

    def option_text(self) -> str:
        return ",".join(k if v == "" else f"{k}={v}" for k, v in self.options.items())


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


def _unescape(text: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and len(text[i + 1 : i + 4]) == 3 and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _parse_options(*texts: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for text in texts:
        for item in text.split(","):
            if item:
                key, _, value = item.partition("=")
                options[key] = value
    return options


def read_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[Mount]:
    mounts = []
    with open(mountinfo) as lines:
        for line in lines:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 6 or len(tail) < 3:
                continue
            mounts.append(
                Mount(
                    mount_point=_unescape(fields[4]),
                    fstype=tail[0],
                    source=_unescape(tail[1]),
                    options=_parse_options(fields[5], tail[2]),
                    device=fields[2],
                )
            )
    return mounts


def find_mount(path: str, mountinfo: str = "/proc/self/mountinfo") -> Mount:
    """The mount ``path`` lies on: the longest mount point containing it (the last one mounted)."""
    real = os.path.realpath(path)
    best: Mount | None = None
    for mount in read_mounts(mountinfo):
        point = mount.mount_point.rstrip("/") or "/"
        inside = real == point or real.startswith(point + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    if best is None:
        raise OSError(f"no mount found for {real}")
    return best


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
