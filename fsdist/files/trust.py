"""What fsdist takes over from a shared place is checked after it is opened, never trusted by name.

A run directory sits on a filesystem other users see, and node-local files in /dev/shm, which
every user of the machine sees. Whatever fsdist finds already there may have been planted: a
world-writable directory of another user, a record they wrote, a FIFO where a file belongs, a
symbolic link. So every directory and file fsdist adopts is opened first (never through a link)
and its ``fstat`` checked: the expected type, owned by this user (or in the group named by
FSDIST_GROUP), writable by nobody else. A name checked and then opened could be swapped between
the two; an open descriptor cannot. What fsdist makes itself it makes with ``O_EXCL``, so it never
adopts by accident. (The anchors: OpenSSH's ``StrictModes``, ssh-agent's private socket
directory, systemd's ``/run/user/$UID``.)

Above the run directory the rule is the kernel's ``protected_symlinks``: a symbolic link on the
way must be this user's or root's, and no directory on the way may be writable by everyone
without the sticky bit (anyone could swap what lies below it; ``/tmp``, sticky, is fine).
"""

from __future__ import annotations

import errno
import functools
import grp
import logging
import os
import pwd
import stat
import time
from collections import deque
from dataclasses import dataclass

from ..defaults import ENV_GROUP, ENV_GROUP_ACCESS, local_dir
from ..errors import FsdistError, ProtocolError, UntrustedPathError

_log = logging.getLogger(__name__)

__all__ = [
    "OPEN_FLAGS",
    "Sharing",
    "adopt_run_directory",
    "check_open",
    "check_stat",
    "describe",
    "existing_node_directory",
    "make_private_dir",
    "node_directory",
    "refusal",
    "resolve_directory",
    "sharing",
    "size_checked",
]

#: O_NOFOLLOW: a symlink planted in the shared directory must never redirect our reads or writes.
OPEN_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

_KINDS = {
    stat.S_IFDIR: "directory", stat.S_IFREG: "file", stat.S_IFIFO: "FIFO", stat.S_IFLNK: "symbolic link",
    stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
}  # fmt: skip
_MAX_LINKS = 40  # as the kernel's ELOOP limit
#: The advice under a refusal: what to do about something found in fsdist's place.
FIX_INSIDE = (
    "fsdist adopts only what this user (or the group FSDIST_GROUP names) made and nobody else can "
    "write: another user (or a damaged run) put it there. Use a run directory of your own, or remove it"
)
FIX_RUN_DIR = (
    "Use a directory of your own that nobody else can write (it is made 0700 if it does not exist), "
    f"or, for ranks of several users, a directory of the group they share with {ENV_GROUP}=<group>"
)


#: How long a member of FSDIST_GROUP waits for a directory another member has just made to become
#: the group's (``make_private_dir``): the maker's fchown and fchmod follow its mkdir at once,
#: unless it stopped in between.
GROUP_SETTLE_SECONDS = 2.0


@dataclass(frozen=True)
class Sharing:
    """Who a job's files belong to: this user alone, or also the members of one named group."""

    uid: int
    gid: int | None  # FSDIST_GROUP's, or None: this user alone
    group: str  # its name, for messages

    @property
    def dir_mode(self) -> int:
        """Directories: private, or the group's (set-group-ID: what is made inside is the group's too)."""
        return 0o2770 if self.gid is not None else 0o700

    @property
    def file_mode(self) -> int:
        return 0o660 if self.gid is not None else 0o600

    def owns(self, st: os.stat_result) -> bool:
        """This user's; or, with a named group, in that group and made by one of its members (or
        root): a non-member can make things of the group in a set-group-ID folder of it."""
        if st.st_uid == self.uid:
            return True
        return self.gid is not None and st.st_gid == self.gid and _member(st.st_uid, self.gid)

    def may_write(self, st: os.stat_result) -> bool:
        """Whether the mode lets only this user (and the named group) write. A group that is this
        user's own (a user-private group: the umask 002 default of many systems) counts as the user."""
        if st.st_mode & stat.S_IWOTH:
            return False
        if not st.st_mode & stat.S_IWGRP or (self.gid is not None and st.st_gid == self.gid):
            return True
        return _private_group(st.st_gid, self.uid)


_cached: tuple[tuple[int, str, str], Sharing] | None = None


@functools.lru_cache(maxsize=256)
def _member(uid: int, gid: int) -> bool:
    """Whether user ``uid`` is root or a member of group ``gid`` (its primary group, or listed)."""
    if uid == 0:
        return True
    try:
        user = pwd.getpwuid(uid)
        return user.pw_gid == gid or user.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


@functools.lru_cache(maxsize=64)
def _private_group(gid: int, uid: int) -> bool:
    """Whether ``gid`` is user ``uid``'s own private group: its primary group, of its name, with no
    other member listed."""
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return user.pw_gid == gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def sharing() -> Sharing:
    """This process's sharing, from FSDIST_GROUP (read again when the user or the variable changes)."""
    global _cached
    uid, name, old = os.geteuid(), os.environ.get(ENV_GROUP, ""), os.environ.get(ENV_GROUP_ACCESS, "")
    key = (uid, name, old)
    if _cached is not None and _cached[0] == key:
        return _cached[1]
    if old not in ("", "0") and not name:
        raise FsdistError(
            f"{ENV_GROUP_ACCESS}=1 is no longer read: it shared files with the primary group, which is often "
            f"every user. Name the group the ranks share instead: {ENV_GROUP}=<group name>"
        )
    if not name:
        result = Sharing(uid, None, "")
    else:
        try:  # a name or a number, of a group the group database knows: its members are trusted
            gid = grp.getgrgid(int(name)).gr_gid if name.isdigit() else grp.getgrnam(name).gr_gid
        except KeyError:
            raise FsdistError(
                f"{ENV_GROUP}={name}: no such group in this machine's group database (fsdist must know its "
                "members, to trust what they make)"
            ) from None
        if gid not in (os.getegid(), *os.getgroups()) and uid != 0:
            raise FsdistError(
                f"{ENV_GROUP}={name}: this user ({_user(uid)}) is not a member of group {_group(gid)}: "
                "every rank's user must be"
            )
        result = Sharing(uid, gid, _group(gid))
    _cached = (key, result)
    return result


def describe(st: os.stat_result) -> str:
    """``a directory owned by bob (uid 1002), group bob (gid 1002), mode 0777 (rwxrwxrwx)``."""
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "file of unknown type")
    perms = stat.filemode(st.st_mode)[1:]
    return (
        f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} owned by {_user(st.st_uid)}, group {_group(st.st_gid)}, "
        f"mode {stat.S_IMODE(st.st_mode):04o} ({perms})"
    )


def check_stat(st: os.stat_result, path: str, kind: str, fix: str = FIX_INSIDE) -> None:
    """Refuse ``path`` unless ``st`` (its ``fstat``) is a ``kind`` ("directory", "file", "FIFO")
    this user (or the named group) owns and nobody else can write."""
    found = _KINDS.get(stat.S_IFMT(st.st_mode), "file of unknown type")
    share = sharing()
    problems = []
    if found != kind:
        problems.append(f"it is a {found}, not a {kind}")
    if not share.may_write(st):
        problems.append("every user can write it" if st.st_mode & stat.S_IWOTH else "its group can write it")
    if not share.owns(st):
        whose = f"you ({_user(share.uid)})" + (f" or group {share.group}" if share.gid is not None else "")
        problems.append(f"another user owns it, not {whose}")
    if problems:
        raise UntrustedPathError(f"refusing {path}: {'; '.join(problems)}. It is {describe(st)}. {fix}")


#: What ``open`` says when something other than the expected file lies at a path: a symbolic link
#: (O_NOFOLLOW), a directory opened for writing, a socket or a FIFO nobody reads (O_NONBLOCK), a
#: device without a driver, a file where a directory belongs.
REFUSED_OPEN = {errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENODEV, errno.ENOTDIR, errno.EOPNOTSUPP, errno.EACCES}


def refusal(path: str, kind: str, exc: OSError, fix: str = FIX_INSIDE) -> OSError | UntrustedPathError:
    """The error for an ``open`` of ``path`` that failed with ``exc``: a refusal describing what lies
    there, where that is not a ``kind`` of this user's (else ``exc`` itself: a missing file stays a
    missing file, and a file of this user's that it may not open says so)."""
    if exc.errno not in REFUSED_OPEN:
        return exc
    try:
        found = os.lstat(path)
        check_stat(found, path, kind, fix)
    except UntrustedPathError as refused:
        return refused
    except OSError:
        return exc
    return exc


def check_open(fd: int, path: str, kind: str = "file", fix: str = FIX_INSIDE) -> os.stat_result:
    """``check_stat`` on an open descriptor (what was opened is what is checked); its stat."""
    st = os.fstat(fd)
    check_stat(st, path, kind, fix)
    return st


def size_checked(st: os.stat_result, path: str, limit: int, what: str) -> int:
    """``st``'s size, refused before anything is allocated for it if ``what`` cannot be that large."""
    if st.st_size > limit:
        raise ProtocolError(
            f"{path} holds {st.st_size} bytes, more than {what} can ({limit}): not fsdist's, or damaged"
        )
    return st.st_size


def make_private_dir(path: str, fix: str = FIX_INSIDE) -> None:
    """Create ``path`` (and missing parents) as this user's, or the named group's; one that exists
    is adopted only if it passes ``check_stat``, checked on a descriptor opened without
    following a link.

    With a group, a member that finds the directory another member has just made may meet it
    between that member's ``mkdir`` (the umask's mode, its own group) and its ``fchown`` and
    ``fchmod``: it looks again for up to GROUP_SETTLE_SECONDS before refusing what it finds."""
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        make_private_dir(parent, fix)  # os.makedirs would give missing parents the default mode
    share = sharing()
    try:
        os.mkdir(path, share.dir_mode & 0o777)  # the umask may take bits away, never add
        made = True
    except FileExistsError:
        made = False
    settle_until = time.monotonic() + GROUP_SETTLE_SECONDS if share.gid is not None and not made else 0.0
    while True:
        try:
            _adopt_dir(path, fix, share, made)
            return
        except (UntrustedPathError, PermissionError):
            if time.monotonic() >= settle_until:
                raise
            time.sleep(0.001)


def _adopt_dir(path: str, fix: str, share: Sharing, made: bool) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | OPEN_FLAGS)
    except OSError as exc:  # ELOOP: a symbolic link; ENOTDIR: a file, a FIFO...
        raise refusal(path, "directory", exc, fix) from None
    try:
        if made and share.gid is not None:  # the group's, under any umask; set-group-ID for what is made inside
            os.fchown(fd, -1, share.gid)
            os.fchmod(fd, share.dir_mode)
        check_open(fd, path, "directory", fix)
    finally:
        os.close(fd)


def adopt_run_directory(path: str, create: bool = True) -> str:
    """A run directory: ``path`` resolved (``resolve_directory``), made private if it does not
    exist (``create``), and refused unless it is this user's (or the group's) alone."""
    resolved = resolve_directory(path)
    if create or os.path.lexists(resolved):
        make_private_dir(resolved, fix=FIX_RUN_DIR)
    return resolved


def resolve_directory(path: str) -> str:
    """``path`` made absolute with its symbolic links followed, as ``realpath`` does, refusing a
    link another user owns (they could point it anywhere, any time) and any directory on the way
    that everyone can write without the sticky bit (anyone could replace what lies below).
    What does not exist yet is left as named: fsdist creates it, privately."""
    share = sharing()
    parts = deque(part for part in os.path.abspath(path).split("/") if part)
    resolved, links = "/", 0
    while parts:
        name = parts.popleft()
        if name == "..":
            resolved = os.path.dirname(resolved)
            continue
        _check_passage(resolved, path)
        here = os.path.join(resolved, name)
        try:
            st = os.lstat(here)
        except (FileNotFoundError, NotADirectoryError):
            return os.path.join(here, *parts)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (0, share.uid):
                where = "it" if here == os.path.abspath(path) else f"{here}, on the way to it,"
                raise UntrustedPathError(
                    f"refusing {path}: {where} is a symbolic link another user owns ({describe(st)}): they could "
                    "point it anywhere, at any time. Name the directory it leads to, if that is yours"
                )
            links += 1
            if links > _MAX_LINKS:
                raise FsdistError(f"{path}: more than {_MAX_LINKS} symbolic links on the way (a loop?)")
            target = os.readlink(here)
            parts.extendleft(reversed([part for part in target.split("/") if part and part != "."]))
            if target.startswith("/"):
                resolved = "/"
            continue
        resolved = here
    return resolved


def _check_passage(directory: str, path: str) -> None:
    """Refuse ``directory``, on the way to ``path``, if everyone may rename what is inside it."""
    st = os.lstat(directory)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UntrustedPathError(
            f"refusing {path}: every user can write {directory}, on the way to it, and it lacks the sticky "
            f"bit, so anyone could replace what lies below it ({describe(st)}). Use a directory elsewhere, "
            f"or ask its owner to chmod +t {directory}"
        )


def node_directory() -> str:
    """This user's (or the named group's) own folder in the node-local directory (FSDIST_LOCAL_DIR,
    default /dev/shm), where node tiers and single-machine run directories live.

    /dev/shm is every local user's: a name there that is known in advance could be taken first,
    or swapped for a link. Inside a folder that is this user's alone nobody else can create
    anything, so names there may be known, and a sweep there finds only this user's own things.
    It is made once and never removed: removing it would let another user take the name back.
    """
    path = _node_directory_path()
    make_private_dir(
        path,
        fix="Another user made it first (or it is damaged): remove it, or set FSDIST_LOCAL_DIR to a "
        "directory of your own on this machine",
    )
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
    except UntrustedPathError as exc:
        _log.warning("fsdist: not looking into the node-local folder: %s", exc)
        return None
    finally:
        os.close(fd)
    return path


def _node_directory_path() -> str:
    share = sharing()
    name = f"fsdist-{share.uid}" if share.gid is None else f"fsdist-group-{share.gid}"
    return resolve_directory(os.path.join(local_dir(), name))  # (FSDIST_LOCAL_DIR itself checked on the way)


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"
