"""What filesystem a directory is on, and what its mount options mean for fsdist.

fsdist's correctness rests on two properties of the shared directory: an exclusive fcntl lock
excludes every other process that reaches the file, on every node, and data written under the
lock is what the next holder reads. Both hold on local filesystems, NFS with its lock manager,
Lustre with ``flock``, GPFS and lock-coherent GlusterFS, but a few mount options and FUSE
filesystems silently keep locks local to one client. This module reads
``/proc/self/mountinfo`` (and, for FUSE, what the filesystem's daemon says about itself) and
turns it into findings; ``fsdist.doctor`` adds measurements. The measured behaviour behind each
rule is in ``docs/filesystems.md``.

Longer than most modules (~340 lines) on purpose: ``classify`` is the rule table for every
filesystem family, read top to bottom in the order the rules apply, as docs/filesystems.md
presents them; split by family, the order that decides a verdict would be invisible.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..defaults import ENV_ALLOW_UNSAFE_FS

__all__ = [
    "LOCAL_FILESYSTEMS",
    "Finding",
    "Mount",
    "classify",
    "client_key",
    "cross_client_hazard",
    "describe_filesystem",
    "filesystem_name",
    "find_mount",
    "is_local",
    "local_hazard",
]

#: Filesystems whose files live on this machine only: a rewritten file cannot be served from
#: another client's stale cache, so retired message files may be reused (see transport).
LOCAL_FILESYSTEMS = frozenset(
    {"tmpfs", "ramfs", "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "overlay", "zfs", "bcachefs"}
)

OK, WARN, UNSAFE = "ok", "warn", "unsafe"

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
#: FUSE filesystems whose locks stay inside one mount (the kernel's local lock table).
_FUSE_LOCAL_LOCKS = {"sshfs", "s3fs", "gcsfuse", "rclone", "goofys"}


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


def classify(mount: Mount) -> list[Finding]:
    """What the mount type and options say, before any measurement."""
    fstype, opts = mount.fstype, mount.options
    base = fstype.split(".", 1)[1] if fstype.startswith("fuse.") else fstype
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
    if fstype == "fuse.glusterfs":
        return [Finding("locking", OK, "GlusterFS forwards fcntl locks to the bricks"), *_gluster_findings(mount)]
    if fstype.startswith("fuse"):
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
                    UNSAFE,
                    "JuiceFS: its locks exclude across clients, but a read under the lock through a descriptor "
                    "held open shows another client's rewrite only when that client closed or fsynced and this "
                    "one re-opened (measured, JuiceFS 1.4.2, also with every cache timeout 0: held open, not "
                    "within 3 s; ~200 of ~350 lock-guarded increments lost across two mounts), and fsdist's "
                    "records are held open",
                    "run the job's ranks through one JuiceFS mount (one machine), or keep the run directory on NFS",
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
    return [
        Finding("locking", WARN, f"{fstype}: not a filesystem fsdist knows", "test it with python -m fsdist doctor")
    ]


def local_hazard(path: str) -> str | None:
    """Why even ranks on *one* client of ``path``'s filesystem would corrupt each other's data."""
    mount = find_mount(path)
    bad = [f for f in classify(mount) if f.verdict == UNSAFE and f.within_one_mount]
    return f"{mount.fstype} at {mount.mount_point}: {bad[0].detail} (fix: {bad[0].fix})" if bad else None


def cross_client_hazard(path: str) -> str | None:
    """Why ranks on *different* clients of ``path``'s filesystem would corrupt each other's
    data, or None when nothing known says so (a FUSE filesystem of unknown kind is not refused)."""
    mount = find_mount(path)
    bad = [f for f in classify(mount) if f.verdict == UNSAFE]
    if not bad:
        return None
    text = "; ".join(f"{f.detail} (fix: {f.fix})" if f.fix else f.detail for f in bad)
    return f"{mount.fstype} at {mount.mount_point}: {text}"
