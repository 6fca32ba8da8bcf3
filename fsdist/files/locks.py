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

import contextlib
import errno
import fcntl
import os
import secrets
import struct
import threading
import time
from collections.abc import Callable, Iterator

from .io import open_file, retrying, unlink_quietly

_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", None)
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on Linux: type, whence, start, len, pid (0 for OFD)
SHARED, EXCLUSIVE, UNLOCK = fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK


def lock(fd: int, kind: int) -> None:
    """Lock (or unlock) the whole file: an OFD lock where available, else a POSIX one."""
    global _OFD_SETLKW
    while True:
        try:
            if _OFD_SETLKW is not None:
                fcntl.fcntl(fd, _OFD_SETLKW, _FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0))
            else:
                posix = {SHARED: fcntl.LOCK_SH, EXCLUSIVE: fcntl.LOCK_EX, UNLOCK: fcntl.LOCK_UN}[kind]
                fcntl.lockf(fd, posix)
            return
        except OSError as exc:
            if exc.errno == errno.EINVAL and _OFD_SETLKW is not None:
                _OFD_SETLKW = None  # this kernel or filesystem has no OFD locks: POSIX locks then
            elif exc.errno in (errno.EINTR, errno.EDEADLK):  # EDEADLK: POSIX locks' false cycles
                time.sleep(1e-4)
            else:
                raise


__all__ = ["EXCLUSIVE", "SHARED", "UNLOCK", "Counter", "LockedRecord", "lock", "read_locked", "try_lock"]


def try_lock(fd: int) -> bool:
    """Take an exclusive lock without waiting: True if taken, False if another holder has one."""
    try:
        if _OFD_SETLKW is not None:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(EXCLUSIVE, os.SEEK_SET, 0, 0, 0))
        else:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def read_locked(path: str, size: int | None = None) -> tuple[bytes, float | None]:
    """A record's bytes (up to ``size``) and its mtime, read under a shared lock through a
    read-only descriptor; ``(b"", None)`` if it does not exist. For readers that must never
    create or change a file (``fsdist status``)."""
    try:
        fd = open_file(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return b"", None
    try:
        lock(fd, SHARED)
        try:
            stat = os.fstat(fd)
            return os.pread(fd, stat.st_size if size is None else size, 0), stat.st_mtime
        finally:
            lock(fd, UNLOCK)
    finally:
        os.close(fd)


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
            lock(self._fd, SHARED)
            try:
                return self._read_unlocked(offset, size)
            finally:
                lock(self._fd, UNLOCK)

    def write(self, data: bytes, offset: int = 0) -> None:
        """Overwrite ``len(data)`` bytes at ``offset`` under an exclusive lock."""
        with self._thread_lock:
            lock(self._fd, EXCLUSIVE)
            try:
                self._write_unlocked(data, offset)
            finally:
                lock(self._fd, UNLOCK)

    def update(self, change: Callable[[bytes], bytes | None]) -> bytes:
        """Replace the whole content with ``change(old)`` atomically; ``None`` keeps it.

        Returns the content in force afterwards. This is the compare-and-set building block.
        """
        with self._thread_lock:
            lock(self._fd, EXCLUSIVE)
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
                lock(self._fd, UNLOCK)

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
        return bytes(view[:done])  # one copy: every poll of a peer reads its 8 KiB position part

    def _write_unlocked(self, data: bytes, offset: int) -> None:
        try:
            written = retrying(lambda: os.pwrite(self._fd, data, offset))
        except OSError as exc:  # EIO, ENOSPC, EDQUOT...: say which file
            raise OSError(exc.errno, exc.strerror, self.path) from exc
        if written != len(data):
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")

    @contextlib.contextmanager
    def held(self, kind: int = EXCLUSIVE) -> Iterator[None]:
        """Hold the lock for a while (a probe testing that it excludes others)."""
        with self._thread_lock:
            lock(self._fd, kind)
            try:
                yield
            finally:
                lock(self._fd, UNLOCK)

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
    """A 64-bit integer in a file, changed only under the lock (get / add / compare-and-set).

    The file holds the value as 8 bytes, little-endian, signed; empty means 0."""

    def __init__(self, path: str) -> None:
        self._record = LockedRecord(path)

    @staticmethod
    def encode(value: int) -> bytes:
        return _INT64.pack(value)

    @staticmethod
    def decode(raw: bytes) -> int:
        return _decode(raw)

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

    def __enter__(self) -> Counter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode(raw: bytes) -> int:
    return int(_INT64.unpack(raw[:8])[0]) if len(raw) >= 8 else 0
