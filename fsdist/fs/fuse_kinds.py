"""FUSE filesystems, kind by kind: which forward fcntl locks to a server, which keep them inside
one mount, and which are known to break fsdist in other ways.

A FUSE mount's type says little ("fuse", or "fuse.<subtype>"): the daemon serving it (its
command line) and, for MooseFS, the mount's source name it. Each rule here was measured across two
mounts of the filesystem (``make test-fs``, ``make test-gluster``; docs/filesystems.md has the
numbers); ``fs/hazards.py`` applies them after the kernel filesystems' rules.
"""

from __future__ import annotations

import os

from ..defaults import ENV_ALLOW_UNSAFE_FS
from .mounts import OK, UNSAFE, WARN, Finding, Mount

__all__ = ["fuse_daemon", "fuse_findings"]

#: GlusterFS client translators that cache data or metadata; with any of them loaded a read
#: under an fcntl lock can return old data through a second client (measured: 50% of
#: lock-guarded increments lost across two mounts).
_GLUSTER_CACHES = (
    "quick-read",
    "io-cache",
    "read-ahead",
    "md-cache",
    "open-behind",
    "readdir-ahead",
    "write-behind",
    "nl-cache",
)
_GLUSTER_MOUNT_OPTIONS = ("attribute-timeout=0", "entry-timeout=0", "negative-timeout=0", "direct-io-mode=enable")
#: FUSE filesystems that implement locks themselves (and so across clients).
_FUSE_LOCKING = {"glusterfs", "ceph-fuse", "ceph", "lustre"}
#: ceph-fuse's command line turning the kernel's page cache off (what makes its reads coherent)
_CEPH_NO_PAGECACHE = {"--fuse_disable_pagecache=true", "--fuse_disable_pagecache=1", "--fuse_disable_pagecache"}
#: FUSE filesystems whose locks stay inside one mount (the kernel's local lock table).
_FUSE_LOCAL_LOCKS = {"sshfs", "s3fs", "gcsfuse", "rclone", "goofys"}


def fuse_daemon(mount_point: str) -> list[str] | None:
    """The command line of the process serving a FUSE mount (its last argument names the mount)."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = [a.decode(errors="replace") for a in cmdline.read().split(b"\0") if a]
        except OSError:
            continue
        paths = (a.split("=", 1)[1] if a.startswith("-") and "=" in a else a for a in argv[1:])  # -dir=/mnt
        if argv and any(os.path.realpath(p) == mount_point for p in paths if p.startswith("/")):
            return argv
    return None


def _gluster_layers(mount_point: str) -> list[str] | None:
    """The translators of a GlusterFS client's active graph, from its virtual ``.meta`` folder."""
    try:
        return os.listdir(os.path.join(mount_point, ".meta", "graphs", "active"))
    except OSError:
        return None


def _gluster_findings(mount: Mount) -> list[Finding]:
    layers = _gluster_layers(mount.mount_point)
    if layers is None:
        return [Finding("coherence", WARN, "GlusterFS client graph not readable (.meta): caches unknown")]
    caches = sorted({c for c in _GLUSTER_CACHES for layer in layers if layer.endswith("-" + c)})
    argv = fuse_daemon(mount.mount_point) or []
    missing = [o for o in _GLUSTER_MOUNT_OPTIONS if not any(a.lstrip("-") == o for a in argv)]
    if not caches and not missing:
        return [Finding("coherence", OK, "GlusterFS client caches off, zero timeouts, direct I/O: lock-coherent")]
    volume = next((a.split("=", 1)[1].lstrip("/") for a in argv if a.startswith("--volfile-id=")), "VOL")
    fixes = []
    if caches:
        names = " ".join("stat-prefetch" if c == "md-cache" else c for c in caches)
        fixes.append(f"for o in {names}; do gluster volume set {volume} performance.$o off; done")
    if missing:
        fixes.append(f"mount with -o {','.join(missing)}")
    return [
        Finding(
            "coherence",
            UNSAFE,
            f"GlusterFS client caches on ({', '.join(caches) or 'none'}; mount options missing: "
            f"{', '.join(missing) or 'none'}): a read under an fcntl lock can return old data through "
            "another client, and lock-guarded counters lose updates",
            "; ".join(fixes),
        )
    ]


def fuse_findings(mount: Mount) -> list[Finding]:
    """What a FUSE mount's subtype and daemon say about its locks, in the order the rules apply:
    GlusterFS (its client graph), bindfs, the kinds that keep locks in one mount, SeaweedFS,
    JuiceFS, MooseFS (named by its source only), the kinds that lock cluster-wide, then unknown.

    What a FUSE daemon's caches show through a descriptor held open is not judged here: on FUSE
    (GlusterFS aside) fsdist reads records through fresh descriptors (files/locks.py)."""
    fstype = mount.fstype
    base = fstype.split(".", 1)[1] if fstype.startswith("fuse.") else fstype
    if fstype == "fuse.glusterfs":
        return [Finding("locking", OK, "GlusterFS forwards fcntl locks to the bricks"), *_gluster_findings(mount)]
    argv = fuse_daemon(mount.mount_point) or []
    daemon = os.path.basename(argv[0]) if argv else base
    if daemon == "bindfs" or base == "bindfs":
        if "--enable-lock-forwarding" in argv:
            return [
                Finding(
                    "locking",
                    UNSAFE,
                    "bindfs --enable-lock-forwarding takes every lock as the bindfs process itself: "
                    "processes on one mount do not exclude each other (measured: half of the "
                    "lock-guarded increments lost, on one mount and across two)",
                    "use the underlying directory; fsdist would corrupt data even on one machine",
                    within_one_mount=True,
                )
            ]
        return [
            Finding(
                "locking",
                UNSAFE,
                "bindfs without --enable-lock-forwarding: locks are local to this mount",
                "use the underlying directory, or bindfs --multithreaded --enable-lock-forwarding",
            )
        ]
    if daemon in _FUSE_LOCAL_LOCKS or base in _FUSE_LOCAL_LOCKS:
        return [
            Finding(
                "locking",
                UNSAFE,
                f"{daemon} (FUSE) does not forward locks: they are local to this mount",
                "use a filesystem with shared locks (NFS, Lustre, GPFS, GlusterFS)",
            )
        ]
    if base == "seaweedfs":
        if "-dlm" in argv or "--dlm" in argv:
            return [
                Finding(
                    "locking",
                    UNSAFE,
                    "SeaweedFS mounted with -dlm lets one mount at a time hold a file open for writing: an "
                    "open through another mount waits in the kernel until the first one closes (measured, "
                    "4.48: doctor and a 4-rank job stuck in open() for 10 minutes, unkillable until the FUSE "
                    "connections were aborted); fsdist's ranks keep their records open, so ranks through two "
                    "mounts hang before fsdist could say why, and a job of several ranks is refused even "
                    "through one mount",
                    "keep the run directory on NFS, or mount without -dlm and run every rank through one "
                    f"mount with {ENV_ALLOW_UNSAFE_FS}=1",
                    within_one_mount=True,
                )
            ]
        return [
            Finding(
                "locking",
                UNSAFE,
                "SeaweedFS's weed mount keeps fcntl and flock locks inside one mount unless started with -dlm "
                "(and -dlm makes a job across mounts hang in open()), and a lock of a SIGKILLed process "
                "outlived it (measured, 4.48): the next job in the directory would wait on it, so a job of "
                "several ranks is refused even through one mount",
                f"keep the run directory on NFS, or set {ENV_ALLOW_UNSAFE_FS}=1 for a job whose ranks all use "
                "one mount (and clean up after a crash)",
                within_one_mount=True,
            )
        ]
    if base == "juicefs":
        return [
            Finding(
                "locking",
                OK,
                "JuiceFS takes fcntl and flock locks in its metadata engine, across clients; a descriptor held "
                "open shows another client's rewrite late (measured, 1.4.2: not within 3 s), so fsdist reads its "
                "records on FUSE through a fresh descriptor and fsyncs before each unlock (then: 0 lost updates, "
                "a rewrite seen after ~3 ms)",
            )
        ]
    if mount.source.startswith("mfs#"):
        return [
            Finding(
                "locking",
                OK,
                "MooseFS takes fcntl and flock locks at its master, unless mounted with mfsnoposixlocks or "
                "mfsnobsdlocks, which the mount table does not show: --peer-mount measures it, and so does "
                "every job whose ranks span clients",
            )
        ]
    if base in ("ceph-fuse", "ceph") or daemon == "ceph-fuse":
        if not any(a.startswith("--") and "--" + a[2:].replace("-", "_") in _CEPH_NO_PAGECACHE for a in argv):
            return [
                Finding(
                    "locking",
                    UNSAFE,
                    "ceph-fuse without --fuse_disable_pagecache=true on its command line: its locks go to the "
                    "MDS, but with the kernel's page cache on a record rewritten under the lock through another "
                    "client read old for more than 3 s, even through a fresh descriptor (measured, 16.2: half of "
                    "the lock-guarded increments lost), and a job's start-up check did not always catch it",
                    "mount with ceph-fuse --fuse_disable_pagecache=true (set only in ceph.conf, fsdist cannot see "
                    f"it: then {ENV_ALLOW_UNSAFE_FS}=1, after doctor --peer-mount says safe)",
                )
            ]
        return [Finding("locking", OK, "ceph-fuse with its page cache off: locks and reads go through the MDS")]
    if base in _FUSE_LOCKING:
        return [Finding("locking", OK, f"{base} (FUSE) implements cluster-wide locks")]
    return [
        Finding(
            "locking",
            WARN,
            f"FUSE filesystem '{daemon}': not known whether it forwards locks",
            "test it: python -m fsdist doctor DIR --peer-mount DIR_ON_ANOTHER_MOUNT",
        )
    ]
