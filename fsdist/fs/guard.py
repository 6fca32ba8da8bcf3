"""Refuse to start a job whose ranks would corrupt each other's files.

fsdist needs fcntl locks that exclude across every client of the run directory, and reads
under the lock that see the last holder's writes. Some filesystems give that only within one
client (NFS ``nolock``/``local_lock=posix``, Lustre ``localflock``, bindfs, sshfs, GlusterFS
with its client caches on): fine for a job on one machine through one mount, silent data
corruption across nodes. So each rank records in the rendezvous which *client* it reaches the
directory through (boot id + device) and what its mount is known to lack; when a generation's
members span more than one client and any of them sits on such a mount, every rank refuses
with the mount option and its fix. ``FSDIST_ALLOW_UNSAFE_FS=1`` overrides (a warning then).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..defaults import ENV_ALLOW_UNSAFE_FS, ENV_SECRET_FILE, ENV_SLURM_JOB_NUM_NODES, ENV_SLURM_NNODES
from ..errors import RendezvousError
from .hazards import cross_client_hazard, local_hazard
from .mounts import client_key, describe_filesystem, find_mount, is_local

log = logging.getLogger(__name__)

__all__ = [
    "allowed", "check_members", "corrupted", "damaged", "describe_client", "lock_hint", "refuse_known_multinode",
    "suspect", "warn_of_a_shared_secret",
]  # fmt: skip

#: network filesystems whose every client could read a file of the user's, root impersonating any uid
_NETWORK = ("nfs", "nfs4", "cifs", "smb3", "ceph", "fuse.glusterfs", "fuse.sshfs", "lustre", "gpfs")


def allowed() -> bool:
    return os.environ.get(ENV_ALLOW_UNSAFE_FS, "") not in ("", "0")


def describe_client(root: str) -> dict[str, str]:
    """What this rank adds to its rendezvous entry: its client, and its mount's hazard (or "")."""
    try:
        return {
            "client": client_key(root),
            "fs_hazard": cross_client_hazard(root) or "",
            "fs_local_hazard": local_hazard(root) or "",
        }
    except OSError as exc:  # no /proc/self/mountinfo (not Linux): nothing known
        log.debug("fsdist: cannot classify the filesystem of %s: %s", root, exc)
        return {"client": "", "fs_hazard": "", "fs_local_hazard": ""}


def warn_of_a_shared_secret() -> None:
    """Warn (once a process) when FSDIST_SECRET_FILE lies on a network filesystem without Kerberos:
    root on any of its clients can read it there, and forge what the MAC was meant to stop."""
    path = os.environ.get(ENV_SECRET_FILE, "")
    if not path or path in _warned:
        return
    _warned.add(path)
    try:
        mount = find_mount(os.path.realpath(path))
    except OSError:
        return
    if mount.fstype in _NETWORK and not mount.options.get("sec", "").startswith("krb5"):
        log.warning(
            "fsdist: %s=%s lies on %s (%s, without sec=krb5*): root on any client of it can read the secret "
            "and forge what the MAC should refuse. Keep it on each machine's own disk (docs/security.md)",
            ENV_SECRET_FILE, path, mount.mount_point, mount.fstype,
        )  # fmt: skip


_warned: set[str] = set()


def _error(root: str, hazard: str, why: str) -> RendezvousError:
    return RendezvousError(
        f"refusing to start: {why}, but {hazard}. Ranks on different clients would corrupt the job's files "
        f"(or hang, where so said). Fix the mount (python -m fsdist doctor {root} "
        f"--peer-mount ... shows what it does), or set {ENV_ALLOW_UNSAFE_FS}=1 to start anyway"
    )


def corrupted(root: str, hazard: str, path: str, exc: Exception) -> RendezvousError:
    """The rendezvous file read back corrupt on a mount known to lose lock-guarded writes."""
    what = f"the rendezvous file {path} read back corrupt ({exc}; delete it once the mount is fixed)"
    return damaged(root, hazard, what)


def damaged(root: str, hazard: str, what: str) -> RendezvousError:
    """The rendezvous lost a write (``what``) on a mount known to lose lock-guarded writes: the
    refusal, or where FSDIST_ALLOW_UNSAFE_FS=1 already let the job try, what that cost it."""
    if not allowed():
        return _error(root, hazard, what)
    return RendezvousError(
        f"{what}: {ENV_ALLOW_UNSAFE_FS}=1 let the job start on a mount where {hazard}, and the mount lost a "
        f"lock-guarded write as it can. Fix the mount (python -m fsdist doctor {root} --peer-mount ... shows "
        "what it does)"
    )


def suspect(root: str, error: RendezvousError) -> RendezvousError:
    """``error`` (the rendezvous file read back corrupt), naming the likely cause where the run
    directory is shared: locks that do not exclude across clients, which a mount may not show
    (MooseFS ``mfsnoposixlocks``, SeaweedFS without ``-dlm``). A job that got past the
    rendezvous measures it (job/lock_check.py); one that did not, gets this."""
    return error if is_local(root) else type(error)(f"{error}; {lock_hint(root, 'this is what happens')}")


def lock_hint(root: str, what: str) -> str:
    """Where ``root`` is shared: ``what`` (a symptom) is what locks that do not hold across the
    clients cause, and how to measure it."""
    return (
        f"on {describe_filesystem(root)} {what} when the clients' locks do not exclude each other: if the "
        f"ranks reach {root} through several nodes or mounts, `python -m fsdist doctor {root} --peer-mount DIR2` "
        "measures whether they do"
    )


def refuse_known_multinode(root: str, me: dict[str, Any], world_size: int) -> None:
    """Before joining: a job that says it spans nodes (SLURM, torchrun/fsdist run) is refused at
    once on a hazardous mount, before its lock-guarded rendezvous file can be corrupted; so is
    any job of several ranks on a mount whose locks do not even exclude within one client."""
    if me.get("fs_local_hazard") and world_size > 1:
        error = _error(root, me["fs_local_hazard"], "this job has several ranks")
        if not allowed():
            raise error
        log.warning("fsdist: %s (starting anyway: %s is set)", error, ENV_ALLOW_UNSAFE_FS)
    hazard = me.get("fs_hazard")
    nodes = int(os.environ.get(ENV_SLURM_NNODES, os.environ.get(ENV_SLURM_JOB_NUM_NODES, "1")) or 1)
    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    multinode = nodes > 1 or (world is not None and local is not None and int(world) > int(local))
    if hazard and multinode:
        error = _error(root, hazard, "this job spans several nodes")
        if not allowed():
            raise error
        log.warning("fsdist: %s (starting anyway: %s is set)", error, ENV_ALLOW_UNSAFE_FS)


def check_members(root: str, members: dict[str, dict[str, Any]], warned: set[str]) -> None:
    """Raise when the members seen so far span clients and one of them has a hazard, or when
    a member already refused (so every rank fails with the same reason, not a timeout)."""
    refused = next((m["refused"] for m in members.values() if m.get("refused")), None)
    if refused:
        raise RendezvousError(refused)
    clients = {m.get("client", "") for m in members.values()}
    if len(clients) < 2:
        return
    hazard = next((m["fs_hazard"] for m in members.values() if m.get("fs_hazard")), None)
    if not hazard:
        return
    error = _error(root, hazard, f"ranks reach {root} through {len(clients)} different clients (hosts or mounts)")
    if not allowed():
        raise error
    if hazard not in warned:
        warned.add(hazard)
        log.warning("fsdist: %s (starting anyway: %s is set)", error, ENV_ALLOW_UNSAFE_FS)
