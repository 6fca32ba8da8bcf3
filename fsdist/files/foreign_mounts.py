"""Mounts made by another user: a place is fsdist's only if its filesystem is trusted too.

Another user cannot mount a filesystem in this user's mount namespace, with one exception: FUSE,
through the setuid ``fusermount3``, on a folder she owns. Her daemon then answers every question
about what lies below, the owner and mode of each file too, so every ``fstat`` check passes, and
it reads all that is written there; with ``allow_other`` (which ``user_allow_other`` in
/etc/fuse.conf lets any user set) she plants it at a name fsdist would adopt, such as
``/dev/shm/fsdist-<uid>``. A daemon that stops answering holds every caller in an
uninterruptible wait, so the check reads the kernel's mount table (/proc/self/mountinfo, where
FUSE's ``user_id=`` is set by the kernel, not the daemon) *before* anything below such a mount
is touched. Other mounts were made by root, which is trusted anyway.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import UntrustedPathError
from .mountinfo import Mount, mount_of_descriptor, read_mounts
from .trust import user_name

__all__ = ["MountTable", "check_descriptor_mount", "mounted_by"]


def mounted_by(mount: Mount) -> int:
    """The uid that made ``mount``: FUSE's ``user_id=``, root for every other kind."""
    if not mount.fstype.startswith("fuse"):
        return 0
    try:
        return int(mount.options.get("user_id", "0"))
    except ValueError:
        return -1  # (unreadable: trusted by nobody)


class MountTable:
    """The mount table, read once when first asked (every place fsdist adopts is checked against it)."""

    def __init__(self, mountinfo: str = "/proc/self/mountinfo") -> None:
        self._mountinfo = mountinfo
        self._points: dict[str, Mount] | None = None

    def at(self, path: str) -> Mount | None:
        """The last mount made at ``path`` (absolute, links resolved), or None."""
        if self._points is None:
            try:
                self._points = {m.mount_point.rstrip("/") or "/": m for m in read_mounts(self._mountinfo)}
            except OSError:
                self._points = {}
        return self._points.get(path.rstrip("/") or "/")

    def refuse_foreign(self, here: str, path: str, trusted: Callable[[int], bool], fix: str) -> None:
        """Refuse ``path`` if ``here`` (on the way to it, or it) is the mount point of a
        filesystem a user ``trusted`` does not trust mounted; called before ``here`` is touched."""
        mount = self.at(here)
        if mount is not None and not trusted(mounted_by(mount)):
            raise UntrustedPathError(refusal_text(path, here, mount, fix))


def check_descriptor_mount(fd: int, path: str, trusted: Callable[[int], bool], fix: str) -> None:
    """Refuse what ``fd`` (opened from ``path``) lies on, if a user ``trusted`` does not trust mounted it:
    the check of what was opened, whatever the path led to in the meantime."""
    try:
        mount = mount_of_descriptor(fd)
    except OSError:
        return
    if mount is not None and not trusted(mounted_by(mount)):
        raise UntrustedPathError(refusal_text(path, mount.mount_point, mount, fix))


def refusal_text(path: str, point: str, mount: Mount, fix: str) -> str:
    owner = mounted_by(mount)
    where = "it is" if os.path.abspath(path).rstrip("/") == point.rstrip("/") else f"it lies on {point}, which is"
    hidden = "" if "allow_other" in mount.options else " (without allow_other: nobody else may even look inside)"
    return (
        f"refusing {path}: {where} a FUSE mount ({mount.fstype}, source {mount.source!r}) that "
        f"{user_name(owner)} mounted, not you{hidden}. Its daemon answers every question about what is inside, "
        f"owners and modes too, and reads all that is written there. {fix}; or ask {user_name(owner)} (or an "
        f"administrator) to unmount it: fusermount3 -u {point}"
    )
