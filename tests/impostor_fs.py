"""The attacker's FUSE filesystem of issue 47: a passthrough to a folder of hers that tells every
reader each file is the victim's, in a private mode (0700 folders, 0600 files), so that every
``fstat`` check a victim makes passes. With ``silent`` it stops answering instead (every request
blocks), the way a daemon can hold a reader in an uninterruptible wait.

Run by tests/strangers.py in a child that has dropped to the attacker's uid (libfuse mounts it
through the setuid ``fusermount3``, as any user would); mfusepy (ctypes bindings of libfuse 3,
from the package index) is imported before that child drops its privileges.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from typing import Any

import mfusepy

__all__ = ["ImpostorFS", "serve"]


class ImpostorFS(mfusepy.Operations):
    """Every call goes to ``backing``; every attribute read claims ``uid``:``gid`` and a private mode."""

    use_ns = True

    def __init__(self, backing: str, uid: int, gid: int, silent: bool = False) -> None:
        self.backing, self.uid, self.gid, self.silent = backing, uid, gid, silent
        self.calls: list[str] = []  # what the victim asked of it (the test reports them)
        self._stop = threading.Event()

    def _real(self, path: str) -> str:
        if self.silent:  # never answer: the caller waits as long as the mount stays
            self._stop.wait()
        return os.path.join(self.backing, path.lstrip("/"))

    def _log(self, what: str, path: str) -> None:
        self.calls.append(f"{what} {path}")

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        self._log("getattr", path)
        st = os.lstat(self._real(path))
        private = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        mode = stat.S_IFMT(st.st_mode) | private
        keys = ("st_size", "st_nlink", "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_ino")
        attrs = {key.replace("_ns", ""): getattr(st, key) for key in keys}
        return {**attrs, "st_mode": mode, "st_uid": self.uid, "st_gid": self.gid}

    def readdir(self, path: str, fh: Any) -> list[str]:
        self._log("readdir", path)
        return [".", "..", *os.listdir(self._real(path))]

    def access(self, path: str, amode: int) -> int:
        os.lstat(self._real(path))
        return 0

    def mkdir(self, path: str, mode: int) -> None:
        self._log("mkdir", path)
        os.mkdir(self._real(path), 0o777)

    def mknod(self, path: str, mode: int, dev: int) -> None:
        self._log("mknod", path)
        os.mknod(self._real(path), mode | 0o666, dev)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._real(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._real(path))

    def rename(self, old: str, new: str) -> None:
        os.rename(self._real(old), self._real(new))

    def chmod(self, path: str, mode: int) -> int:
        return 0  # (the victim's fchmod "works"; the backing file stays readable by its owner)

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    def truncate(self, path: str, length: int, fh: Any = None) -> None:
        os.truncate(self._real(path), length)

    def utimens(self, path: str, times: Any = None) -> int:
        return 0

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        self._log("create", path)
        return os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)

    def open(self, path: str, flags: int) -> int:
        self._log("open", path)
        return os.open(self._real(path), flags & ~(os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.backing)
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_frsize")
        return {key: getattr(st, key) for key in keys} | {"f_namemax": 255}


def serve(mount_point: str, backing: str, uid: int, gid: int, silent: bool = False, allow_other: bool = True) -> None:
    """Mount ImpostorFS at ``mount_point`` (as this process's user) and serve it until unmounted."""
    try:
        mfusepy.FUSE(
            ImpostorFS(backing, uid, gid, silent), mount_point, foreground=True, allow_other=allow_other,
            nothreads=False, default_permissions=False,
        )  # fmt: skip
    except RuntimeError as exc:  # libfuse's failure to mount: say which
        raise OSError(errno.EIO, f"mounting the impostor filesystem at {mount_point} failed: {exc}") from None
