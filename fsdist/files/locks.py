"""Small files changed only under an fcntl lock: progress records, counters, the rendezvous state.

Why fcntl and not bare reads: on NFS taking a lock makes the client revalidate its cache and
releasing it flushes writes, so a record read under the lock is coherent across machines. On
local filesystems the lock costs ~1.5 µs. The descriptor stays open: opening a file per access
(as ``filelock`` does) costs ~100 µs.

Open-file-description (OFD) locks, not classic POSIX ``lockf`` locks, where the kernel has them
(Linux ≥ 3.15). POSIX locks belong to the whole process: two threads of one process holding
and waiting for locks on two files look like a deadlock cycle to the kernel, which then fails
one of them with EDEADLK, and closing *any* descriptor of a file drops every lock the process
holds on it. OFD locks belong to the open file: no false deadlocks, and two records on one
file in one process exclude each other like two processes would. Both kinds conflict with each
other, so a peer on a system without OFD locks still interoperates. A threading lock per
record serialises the threads that share its descriptor.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import struct
import threading
import time
from collections.abc import Callable

from .io import open_file, retrying, unlink_quietly

_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", None)
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on Linux: type, whence, start, len, pid (0 for OFD)
_SHARED, _EXCLUSIVE, _UNLOCK = fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK


def _lock(fd: int, kind: int) -> None:
    """Lock (or unlock) the whole file: an OFD lock where available, else a POSIX one."""
    global _OFD_SETLKW
    while True:
        try:
            if _OFD_SETLKW is not None:
                fcntl.fcntl(fd, _OFD_SETLKW, _FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0))
            else:
                posix = {_SHARED: fcntl.LOCK_SH, _EXCLUSIVE: fcntl.LOCK_EX, _UNLOCK: fcntl.LOCK_UN}[kind]
                fcntl.lockf(fd, posix)
            return
        except OSError as exc:
            if exc.errno == errno.EINVAL and _OFD_SETLKW is not None:
                _OFD_SETLKW = None  # this kernel or filesystem has no OFD locks: POSIX locks then
            elif exc.errno in (errno.EINTR, errno.EDEADLK):  # EDEADLK: POSIX locks' false cycles
                time.sleep(1e-4)
            else:
                raise


__all__ = ["Counter", "LockedRecord"]


def _open_record(path: str, create: bool) -> int:
    """Open ``path``, creating it if asked so that every client ends up with the *same* file.

    Several ranks open each record, and two clients creating one name at once with O_CREAT is
    not safe everywhere: on GlusterFS one of them can get a file of its own that nobody else
    sees (measured: 2 in 40 races; its writes vanished) or EEXIST. So the file is made under a
    private name and hard-linked into place, which exactly one creator wins at the server; the
    others find the winner's file.
    """
    for _ in range(100):
        try:
            return open_file(path, os.O_RDWR)
        except FileNotFoundError:
            if not create:
                raise
        head, name = os.path.split(path)
        temp = os.path.join(head, f".tmp.{name}.{secrets.token_hex(4)}")
        try:
            os.close(open_file(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL))
            try:
                retrying(lambda: os.link(temp, path))
            except FileExistsError:
                os.listdir(head or ".")  # revalidates a cached "no such name" (NFS)
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                return open_file(path, os.O_RDWR | os.O_CREAT)  # no hard links here: plain create
        finally:
            unlink_quietly(temp)
    raise FileNotFoundError(errno.ENOENT, "record vanished while being opened", path)


class LockedRecord:
    """A file whose reads and writes happen under an fcntl lock on a descriptor kept open."""

    def __init__(self, path: str, create: bool = True) -> None:
        self.path = path
        self._fd = _open_record(path, create)
        self._thread_lock = threading.Lock()

    def read(self, offset: int = 0, size: int | None = None) -> bytes:
        """Read ``size`` bytes (or to the end) at ``offset`` under a shared lock."""
        with self._thread_lock:
            _lock(self._fd, _SHARED)
            try:
                return self._read_unlocked(offset, size)
            finally:
                _lock(self._fd, _UNLOCK)

    def write(self, data: bytes, offset: int = 0) -> None:
        """Overwrite ``len(data)`` bytes at ``offset`` under an exclusive lock."""
        with self._thread_lock:
            _lock(self._fd, _EXCLUSIVE)
            try:
                self._write_unlocked(data, offset)
            finally:
                _lock(self._fd, _UNLOCK)

    def update(self, change: Callable[[bytes], bytes | None]) -> bytes:
        """Replace the whole content with ``change(old)`` atomically; ``None`` keeps it.

        Returns the content in force afterwards. This is the compare-and-set building block.
        """
        with self._thread_lock:
            _lock(self._fd, _EXCLUSIVE)
            try:
                old = self._read_unlocked(0, None)
                new = change(old)
                if new is None:
                    return old
                self._write_unlocked(new, 0)
                if len(new) < len(old):
                    retrying(lambda: os.ftruncate(self._fd, len(new)))
                return new
            finally:
                _lock(self._fd, _UNLOCK)

    def _read_unlocked(self, offset: int, size: int | None) -> bytes:
        if size is None:
            size = max(0, os.fstat(self._fd).st_size - offset)
        buffer = bytearray(size)
        view = memoryview(buffer)
        done = 0
        while done < size:  # a record shorter than asked (not yet written) reads short
            got = retrying(lambda: os.preadv(self._fd, [view[done:]], offset + done))
            if got == 0:
                break
            done += got
        return bytes(buffer[:done])

    def _write_unlocked(self, data: bytes, offset: int) -> None:
        written = retrying(lambda: os.pwrite(self._fd, data, offset))
        if written != len(data):
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LockedRecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_INT64 = struct.Struct("<q")


class Counter:
    """A 64-bit integer in a file, changed only under the lock (get / add / compare-and-set)."""

    def __init__(self, path: str) -> None:
        self._record = LockedRecord(path)

    def get(self) -> int:
        return _decode(self._record.read(0, 8))

    def add(self, amount: int) -> int:
        """Add ``amount`` and return the new value."""
        new = self._record.update(lambda old: _INT64.pack(_decode(old) + amount))
        return _decode(new)

    def compare_and_set(self, expected: int, desired: int) -> int:
        """Set ``desired`` if the value is ``expected``; return the value in force afterwards."""
        new = self._record.update(lambda old: _INT64.pack(desired) if _decode(old) == expected else None)
        return _decode(new)

    def close(self) -> None:
        self._record.close()


def _decode(raw: bytes) -> int:
    return _INT64.unpack(raw[:8])[0] if len(raw) >= 8 else 0
