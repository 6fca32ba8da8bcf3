"""Where fsdist's own places lie: a run directory, this user's node-local folder, the secret
file. Each path is resolved under the rules for what may stand on the way to it, then opened and
checked on its descriptor (files/trust.py).

On the way to a place:

- a **symbolic link** must be this user's or root's (the kernel's ``protected_symlinks``): another
  user could point theirs anywhere, at any time;
- a **folder** must be owned by root or this user (with FSDIST_GROUP, by a member of the group):
  its owner can rename what is inside it, sticky bit or not, and put a folder of theirs in its
  place; and unless it has the sticky bit, nobody else may write it (anyone who can write it can
  rename what is inside). ``/tmp`` (root's, sticky) is fine; a sticky folder another user owns,
  or a project folder of another user, is not;
- no **filesystem another user mounted** (FUSE; files/foreign_mounts.py): checked in the kernel's
  mount table before its mount point is touched, since its daemon answers every question about
  what lies inside, or never answers.

(The anchors: OpenSSH's ``StrictModes``, which checks every folder above ``authorized_keys`` the
same way; ssh-agent's private socket directory; systemd's ``/run/user/$UID``.)
"""

from __future__ import annotations

import logging
import os
import stat
from collections import deque

from ..defaults import ENV_GROUP, ENV_LOCAL_DIR, local_dir
from ..errors import FsdistError, UntrustedPathError
from .foreign_mounts import MountTable, check_descriptor_mount
from .trust import OPEN_FLAGS, Sharing, check_open, describe, make_private_dir, refusal, sharing, user_name

__all__ = [
    "FIX_RUN_DIR", "adopt_file", "adopt_run_directory", "existing_node_directory", "node_directory", "resolve_place",
]  # fmt: skip

_log = logging.getLogger(__name__)
_MAX_LINKS = 40  # as the kernel's ELOOP limit
FIX_RUN_DIR = (
    "Use a directory of your own that nobody else can write (it is made 0700 if it does not exist), "
    f"or, for ranks of several users, a directory of the group they share with {ENV_GROUP}=<group>"
)
FIX_NODE_DIR = (
    f"Set {ENV_LOCAL_DIR} to a directory of your own on this machine (such as $XDG_RUNTIME_DIR, where it "
    "exists); another user made this one first, or it is damaged, and in a sticky folder only its owner can "
    "remove it"
)


def adopt_run_directory(path: str, create: bool = True) -> str:
    """A run directory: ``path`` resolved (``resolve_place``), made private if it does not exist
    (``create``), and refused unless it is this user's (or the group's) alone, on a filesystem
    nobody else mounted."""
    resolved = resolve_place(path, FIX_RUN_DIR)
    if create or os.path.lexists(resolved):
        make_private_dir(resolved, fix=FIX_RUN_DIR, opened=lambda fd: _check_mount(fd, resolved, FIX_RUN_DIR))
    return resolved


def adopt_file(path: str, fix: str) -> str:
    """A file of fsdist's at ``path`` (resolved by ``resolve_place``) that another program will
    open by name (torch's FileStore): made exclusively, this user's (or the group's) whatever the
    umask, or the one in place refused unless it passes ``check_open``; on no foreign mount."""
    resolved = resolve_place(path, fix)
    share = sharing()
    try:
        fd = os.open(resolved, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, share.file_mode)
        os.fchmod(fd, share.file_mode)
        if share.gid is not None:
            os.fchown(fd, -1, share.gid)
    except FileExistsError:
        try:
            fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS)
        except OSError as exc:
            raise refusal(resolved, "file", exc, fix) from None
    try:
        check_open(fd, resolved, "file", fix)
        _check_mount(fd, resolved, fix)
    finally:
        os.close(fd)
    return resolved


def resolve_place(path: str, fix: str = FIX_RUN_DIR) -> str:
    """``path`` made absolute with its symbolic links followed, as ``realpath`` does, refusing what
    may not stand on the way to a place of fsdist's (the module docstring); ``fix``: the advice
    under a refusal. What does not exist yet is left as named: fsdist creates it, privately."""
    share, mounts = sharing(), MountTable()
    parts = deque(part for part in os.path.abspath(path).split("/") if part)
    resolved, resolved_st, links = "/", None, 0  # (resolved_st: its lstat where the walk made one)
    while parts:
        name = parts.popleft()
        if name == "..":
            resolved, resolved_st = os.path.dirname(resolved), None
            continue
        _check_passage(resolved, resolved_st or os.lstat(resolved), path, share, fix)
        here = os.path.join(resolved, name)
        mounts.refuse_foreign(here, path, share.trusts, fix)  # before anything asks its daemon
        try:
            st = os.lstat(here)
        except (FileNotFoundError, NotADirectoryError):
            return os.path.join(here, *parts)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (0, share.uid):
                where = "it" if here == os.path.abspath(path) else f"{here}, on the way to it,"
                raise UntrustedPathError(
                    f"refusing {path}: {where} is a symbolic link another user owns ({describe(st)}): they could "
                    "point it anywhere, at any time. Name the place it leads to, if that is yours"
                )
            links += 1
            if links > _MAX_LINKS:
                raise FsdistError(f"{path}: more than {_MAX_LINKS} symbolic links on the way (a loop?)")
            target = os.readlink(here)
            parts.extendleft(reversed([part for part in target.split("/") if part and part != "."]))
            if target.startswith("/"):
                resolved, resolved_st = "/", None
            continue
        resolved, resolved_st = here, st
    return resolved


def _check_passage(directory: str, st: os.stat_result, path: str, share: Sharing, fix: str) -> None:
    """Refuse ``directory`` (``st``: its lstat), on the way to ``path``, if someone fsdist does not
    trust may rename what is inside it: its owner, or (without the sticky bit) anyone else who may
    write it."""
    if not share.trusts(st.st_uid):
        raise UntrustedPathError(
            f"refusing {path}: {directory}, on the way to it, belongs to {user_name(st.st_uid)} ({describe(st)}): "
            "its owner can rename what lies inside it, the sticky bit notwithstanding, and put a folder of "
            f"theirs in its place. {fix}, in a folder that you or root own"
        )
    if not share.may_write(st) and not st.st_mode & stat.S_ISVTX:
        who = "every user" if st.st_mode & stat.S_IWOTH else "its group"
        raise UntrustedPathError(
            f"refusing {path}: {who} can write {directory}, on the way to it, and it lacks the sticky bit, so "
            f"{'anyone' if who == 'every user' else 'any member'} could replace what lies below it ({describe(st)}). "
            f"Use a place elsewhere, or ask its owner to chmod +t {directory}"
        )


def _check_mount(fd: int, path: str, fix: str) -> None:
    check_descriptor_mount(fd, path, sharing().trusts, fix)


def node_directory() -> str:
    """This user's (or the named group's) own folder in the node-local directory (FSDIST_LOCAL_DIR,
    default /dev/shm), where node tiers and single-machine run directories live.

    /dev/shm is every local user's: a name there that is known in advance could be taken first,
    or swapped for a link. Inside a folder that is this user's alone nobody else can create
    anything, so names there may be known, and a sweep there finds only this user's own things.
    It is made once and never removed: removing it would let another user take the name back.
    """
    path = _node_directory_path()
    make_private_dir(path, fix=FIX_NODE_DIR, opened=lambda fd: _check_mount(fd, path, FIX_NODE_DIR))
    return path


def existing_node_directory() -> str | None:
    """This user's node-local folder where one is in place and is the user's (``node_directory``),
    else None: what removes things there then finds nothing, and a job that keeps nothing
    node-local is never stopped by another user's folder of that name."""
    try:
        path = _node_directory_path()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except (OSError, UntrustedPathError) as exc:
        _log.warning("fsdist: not looking into the node-local folder: %s", exc)
        return None
    try:
        check_open(fd, path, "directory")
        _check_mount(fd, path, FIX_NODE_DIR)
    except UntrustedPathError as exc:
        _log.warning("fsdist: not looking into the node-local folder: %s", exc)
        return None
    finally:
        os.close(fd)
    return path


def _node_directory_path() -> str:
    share = sharing()
    name = f"fsdist-{share.uid}" if share.gid is None else f"fsdist-group-{share.gid}"
    return resolve_place(os.path.join(local_dir(), name), FIX_NODE_DIR)  # (FSDIST_LOCAL_DIR checked on the way)
