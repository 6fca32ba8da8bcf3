"""What a mount's type and options mean for fsdist: one verdict per property, and the hazards
that refuse a job.

fsdist's correctness rests on two properties of the shared directory: an exclusive fcntl lock
excludes every other process that reaches the file, on every node, and data written under the
lock is what the next holder reads. Both hold on local filesystems, NFS with its lock manager,
Lustre with ``flock``, GPFS and lock-coherent GlusterFS, but a few mount options and FUSE
filesystems silently keep locks local to one client. ``classify`` is the rule table, read top to
bottom in the order the rules apply (FUSE kinds in ``fs/fuse_kinds.py``, in their own order);
``fsdist.doctor`` adds measurements. The measured behaviour behind each rule is in
``docs/filesystems.md``.
"""

from __future__ import annotations

from .fuse_kinds import fuse_findings
from .mounts import LOCAL_FILESYSTEMS, OK, UNSAFE, WARN, Finding, Mount, filesystem_name, find_mount

__all__ = ["classify", "cross_client_hazard", "local_hazard"]


def classify(mount: Mount) -> list[Finding]:
    """What the mount type and options say, before any measurement."""
    fstype, opts = mount.fstype, mount.options
    if fstype in LOCAL_FILESYSTEMS:
        return [Finding("locking", OK, f"{fstype} is a local filesystem: one machine's ranks only")]
    if fstype.startswith("nfs"):
        found = []
        if "nolock" in opts:
            found.append(
                Finding(
                    "locking",
                    UNSAFE,
                    "mounted with 'nolock': fcntl locks are local to this client only",
                    "remount without nolock (with rpc.statd/lockd running); fsdist would corrupt data across nodes",
                )
            )
        elif opts.get("local_lock") in ("all", "posix"):
            found.append(
                Finding(
                    "locking",
                    UNSAFE,
                    f"mounted with 'local_lock={opts['local_lock']}': fcntl locks are local to this client only",
                    "mount with local_lock=none; fsdist would corrupt data across nodes",
                )
            )
        else:
            found.append(Finding("locking", OK, f"{fstype} {opts.get('vers', '')}: locks go to the server".strip()))
        if opts.get("lookupcache", "all") == "all":
            found.append(
                Finding(
                    "lookup cache",
                    WARN,
                    "lookupcache=all (the default): a new file can stay invisible to stat through another "
                    "client for up to acdirmax (~30 s); fsdist never waits on such a stat, other tools may",
                    "mount with lookupcache=positive",
                )
            )
        if "noac" in opts or opts.get("actimeo") == "0":
            found.append(Finding("attribute cache", WARN, "noac/actimeo=0: every stat goes to the server (slow)"))
        return found
    if fstype == "lustre":
        if "localflock" in opts:
            return [
                Finding(
                    "locking",
                    UNSAFE,
                    "mounted with 'localflock': locks are local to this client only",
                    "mount with -o flock; fsdist would corrupt data across nodes",
                )
            ]
        if "noflock" in opts:
            return [Finding("locking", UNSAFE, "mounted with 'noflock': fcntl locks fail", "mount with -o flock")]
        if "flock" in opts:
            return [Finding("locking", OK, "Lustre with flock: coherent cluster-wide locks")]
        return [Finding("locking", WARN, "Lustre without a flock option shown (default flock since 2.12)", "-o flock")]
    if fstype in ("gpfs", "ceph", "beegfs", "orangefs"):
        return [Finding("locking", OK, f"{fstype}: cluster-wide fcntl locks")]
    if fstype.startswith("fuse"):
        return fuse_findings(mount)
    return [
        Finding("locking", WARN, f"{fstype}: not a filesystem fsdist knows", "test it with python -m fsdist doctor")
    ]


def local_hazard(path: str) -> str | None:
    """Why even ranks on *one* client of ``path``'s filesystem would corrupt each other's data."""
    mount = find_mount(path)
    bad = [f for f in classify(mount) if f.verdict == UNSAFE and f.within_one_mount]
    return f"{_where(mount)}: {bad[0].detail} (fix: {bad[0].fix})" if bad else None


def cross_client_hazard(path: str) -> str | None:
    """Why ranks on *different* clients of ``path``'s filesystem would corrupt each other's
    data, or None when nothing known says so (a FUSE filesystem of unknown kind is not refused)."""
    mount = find_mount(path)
    bad = [f for f in classify(mount) if f.verdict == UNSAFE]
    if not bad:
        return None
    text = "; ".join(f"{f.detail} (fix: {f.fix})" if f.fix else f.detail for f in bad)
    return f"{_where(mount)}: {text}"


def _where(mount: Mount) -> str:
    """The mount for a refusal: "CephFS (fuse.ceph-fuse at /mnt/a)"."""
    return f"{filesystem_name(mount)} ({mount.fstype} at {mount.mount_point})"
