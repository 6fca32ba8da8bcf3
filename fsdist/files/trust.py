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

Where a run directory, node folder or secret lies, and what may stand on the way to it, is
files/places.py's part.
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
from collections.abc import Callable
from dataclasses import dataclass

from ..defaults import ENV_GROUP, ENV_GROUP_ACCESS
from ..errors import FsdistError, ProtocolError, UntrustedPathError

_log = logging.getLogger(__name__)

__all__ = [
    "OPEN_FLAGS",
    "Sharing",
    "check_open",
    "check_stat",
    "describe",
    "make_private_dir",
    "refusal",
    "sharing",
    "size_checked",
    "user_name",
]

#: O_NOFOLLOW: a symlink planted in the shared directory must never redirect our reads or writes.
OPEN_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

_KINDS = {
    stat.S_IFDIR: "directory", stat.S_IFREG: "file", stat.S_IFIFO: "FIFO", stat.S_IFLNK: "symbolic link",
    stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
}  # fmt: skip
#: The advice under a refusal: what to do about something found in fsdist's place.
FIX_INSIDE = (
    "fsdist adopts only what this user (or the group FSDIST_GROUP names) made and nobody else can "
    "write: another user (or a damaged run) put it there. Use a run directory of your own, or remove it"
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

    def trusts(self, uid: int) -> bool:
        """Whether user ``uid`` may change what this job keeps: root, this user, a member of the group."""
        return uid in (0, self.uid) or (self.gid is not None and _member(uid, self.gid))

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
                f"{ENV_GROUP}={name}: this user ({user_name(uid)}) is not a member of group {_group(gid)}: "
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
        f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} owned by {user_name(st.st_uid)}, group {_group(st.st_gid)}, "
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
        whose = f"you ({user_name(share.uid)})" + (f" or group {share.group}" if share.gid is not None else "")
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


def make_private_dir(path: str, fix: str = FIX_INSIDE, opened: Callable[[int], None] | None = None) -> None:
    """Create ``path`` (and missing parents) as this user's, or the named group's; one that exists
    is adopted only if it passes ``check_stat``, checked on a descriptor opened without
    following a link (and passed to ``opened``, for a check of the caller's own).

    With a group, a member that finds the directory another member has just made may meet it
    between that member's ``mkdir`` (the umask's mode, its own group) and its ``fchown`` and
    ``fchmod``: it looks again for up to GROUP_SETTLE_SECONDS before refusing what it finds.

    A directory another client is making may answer ``mkdir`` with EEXIST and ``open`` with
    ENOENT for a moment (GlusterFS's distribute layer, between the bricks' ``mkdir``s): then
    it tries both again, for up to GROUP_SETTLE_SECONDS too."""
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        make_private_dir(parent, fix)  # os.makedirs would give missing parents the default mode
    share = sharing()
    settle_until = time.monotonic() + GROUP_SETTLE_SECONDS
    while True:
        try:
            os.mkdir(path, share.dir_mode & 0o777)  # the umask may take bits away, never add
            made = True
        except FileExistsError:
            made = False
        try:
            _adopt_dir(path, fix, share, made, opened)
            return
        except FileNotFoundError:
            if made or time.monotonic() >= settle_until:
                raise
        except (UntrustedPathError, PermissionError):
            if made or share.gid is None or time.monotonic() >= settle_until:
                raise
        time.sleep(0.001)


def _adopt_dir(path: str, fix: str, share: Sharing, made: bool, opened: Callable[[int], None] | None) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | OPEN_FLAGS)
    except OSError as exc:  # ELOOP: a symbolic link; ENOTDIR: a file, a FIFO...
        raise refusal(path, "directory", exc, fix) from None
    try:
        if made and share.gid is not None:  # the group's, under any umask; set-group-ID for what is made inside
            os.fchown(fd, -1, share.gid)
            os.fchmod(fd, share.dir_mode)
        check_open(fd, path, "directory", fix)
        if opened is not None:
            opened(fd)
    finally:
        os.close(fd)


def user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"
