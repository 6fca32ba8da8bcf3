"""Small files changed only under an fcntl lock: progress records, the rendezvous state, store keys.

Why fcntl and not bare reads: on NFS taking a lock makes the client revalidate its cache and
releasing it flushes writes, so a record read under the lock is coherent across machines. On
local filesystems the lock costs ~1.5 µs. The descriptor stays open: opening a file per access
(as ``filelock`` does) costs ~100 µs. FUSE filesystems keep neither promise, and there a record is
read through a fresh descriptor and fsynced before its unlock (``_needs_fresh_descriptors``).

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
from typing import TypeVar

from ..defaults import LOCK_TIMEOUT_SECONDS, TORN_READ_SECONDS
from ..errors import FsdistTimeoutError, ProtocolError
from .io import open_file, retried, retrying, unlink_quietly
from .mountinfo import needs_fresh_descriptors as _needs_fresh_descriptors
from .trust import size_checked
from .waiting import LOCKING, Deadline, poll

T = TypeVar("T")

_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
FLOCK = struct.Struct("hhqqi4x")  # struct flock on Linux: type, whence, start, len, pid (0 for OFD)
SHARED, EXCLUSIVE, UNLOCK = fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK
_POSIX = {SHARED: fcntl.LOCK_SH, EXCLUSIVE: fcntl.LOCK_EX, UNLOCK: fcntl.LOCK_UN}

#: Called every HEALTH_CHECK_SECONDS while a lock is busy, with the seconds waited so far; it
#: raises to end the wait (the holder is dead or stopped, the group aborted, time is up).
OnWait = Callable[[float], None]
#: The largest record read whole unless its format allows more (a peer's state record is read in
#: parts of known size; the rendezvous record may be larger): a larger file is refused before
#: anything is allocated for it, so a planted sparse file costs nothing.
RECORD_MAX_BYTES = 1 << 20

__all__ = [
    "EXCLUSIVE", "RECORD_MAX_BYTES", "SHARED", "UNLOCK", "LockedRecord", "OnWait", "OptimisticRecord", "TornReads",
    "lock", "lock_kind_in_use", "read_locked", "try_lock", "unlock",
]  # fmt: skip


def lock(fd: int, kind: int, path: str = "", on_wait: OnWait | None = None) -> None:
    """Lock (or unlock) the whole file: an OFD lock where available, else a POSIX one.

    Never a blocking F_SETLKW: a holder that stops (SIGSTOP, a debugger, a stalled machine)
    would keep every waiter in the kernel past any deadline, where no health check runs. A
    busy lock is retried instead, paced as every wait is (files/waiting.py ``LOCKING``: at once
    for a while, then short pauses, long ones once the wait is long: on NFS each retry is a call
    to the server). ``on_wait`` judges a long wait; without one the wait fails after
    LOCK_TIMEOUT_SECONDS.
    """
    if _try(fd, kind):  # the common case, without a wait's deadline and schedule
        return
    poll(
        lambda: True if _try(fd, kind) else None,
        Deadline(float("inf") if on_wait is not None else LOCK_TIMEOUT_SECONDS),
        lambda: FsdistTimeoutError(
            f"Timed out after {LOCK_TIMEOUT_SECONDS:.0f} s waiting for the lock on {path or f'descriptor {fd}'}: "
            "another process holds it and does not let go (stopped, or stalled on the filesystem)"
        ),
        on_wait,
        schedule=LOCKING,
    )


def _try(fd: int, kind: int) -> bool:
    """One attempt at ``kind`` without waiting: True if done, False if another holder conflicts."""
    global _OFD_SETLK
    while True:
        try:
            if _OFD_SETLK is not None:
                fcntl.fcntl(fd, _OFD_SETLK, FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0))
            else:
                fcntl.lockf(fd, _POSIX[kind] | (fcntl.LOCK_NB if kind != UNLOCK else 0))
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            if exc.errno == errno.EINVAL and _OFD_SETLK is not None:
                _OFD_SETLK = None  # this kernel or filesystem has no OFD locks: POSIX locks then
            elif exc.errno != errno.EINTR:
                raise


def try_lock(fd: int) -> bool:
    """Take an exclusive lock without waiting: True if taken, False if another holder has one."""
    return _try(fd, EXCLUSIVE)


def unlock(fd: int) -> None:
    """Release what ``try_lock`` took."""
    _try(fd, UNLOCK)


def lock_kind_in_use() -> str:
    """ "ofd" while this process takes OFD locks, "posix" once the kernel or a filesystem refused
    them (``_try`` then falls back for the rest of the process)."""
    return "ofd" if _OFD_SETLK is not None else "posix"


def read_locked(path: str, size: int | None = None, max_size: int = RECORD_MAX_BYTES) -> tuple[bytes, float | None]:
    """A record's bytes (its first ``size``, or all of it, refused if over ``max_size``) and its
    mtime, read under a shared lock through a read-only descriptor; ``(b"", None)`` if it does not
    exist. For readers that must never create or change a file (``fsdist status``)."""
    try:
        fd = open_file(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return b"", None
    try:
        lock(fd, SHARED, path)
        try:
            stat = os.fstat(fd)
            if size is None:
                size = size_checked(stat, path, max_size, "this record")
            return os.pread(fd, size, 0), stat.st_mtime
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
    """A file whose reads and writes happen under an fcntl lock on a descriptor kept open.

    Its kind is one of three, chosen for a group by transport/locality.py: this one, read under
    the lock; ``OptimisticRecord``, read without it first; direct.py's ``DirectRecord``, with no
    lock at all. Readers of a peer's record call ``read_checked``, whatever the kind."""

    #: reads may skip the lock (a torn one is found by the format's checks, ``read_checked``)
    reads_unlocked = False
    #: no lock at all (direct.py): nothing orders a read after the writer's whole write, so a
    #: read may show one part of it and not yet the next (a header, not its slot) and must look
    #: again until both are there
    lockless = False

    def __init__(
        self, path: str, create: bool = True, on_wait: OnWait | None = None, max_size: int = RECORD_MAX_BYTES
    ) -> None:
        """``on_wait``: judges a wait for a busy lock (see ``lock``); a group passes its health
        check, so a peer stopped while holding the lock fails the wait as a stopped peer.
        ``max_size``: the most its format holds (a whole read of a larger file is refused)."""
        self.path = path
        self.max_size = max_size
        self._fd = _open_record(path, create)
        self._thread_lock = threading.Lock()
        self._on_wait = on_wait
        try:
            self._reopen = _needs_fresh_descriptors(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        self._inode = os.fstat(self._fd).st_ino if self._reopen else 0
        self._unsynced = False  # (written since the lock was taken, and not yet fsynced)

    def _lock(self, kind: int) -> None:
        lock(self._fd, kind, self.path, self._on_wait)

    def _release(self) -> None:
        """Unlock; where an unlock does not publish (``_needs_fresh_descriptors``), fsync first."""
        if self._unsynced:
            self._unsynced = False
            try:
                retrying(lambda: os.fsync(self._fd))
            except OSError as exc:
                self._lock(UNLOCK)
                raise OSError(exc.errno, exc.strerror, self.path) from exc
        self._lock(UNLOCK)

    def read(self, offset: int = 0, size: int | None = None) -> bytes:
        """Read ``size`` bytes (or to the end) at ``offset`` under a shared lock."""
        with self._thread_lock:
            self._lock(SHARED)
            try:
                return self._read_unlocked(offset, size)
            finally:
                self._release()

    def read_checked(
        self, offset: int, size: int, parse: Callable[[bytes], T], plausible: Callable[[T], bool] | None = None,
        locked: bool = False,
    ) -> tuple[bytes, T, bool]:  # fmt: skip
        """``size`` bytes at ``offset`` (short where never written), what ``parse`` makes of them,
        and whether they were read without the lock (here never: the lock excludes the writer,
        so ``parse``'s checks and ``plausible`` can only find them damaged)."""
        raw = self.read(offset, size)
        return raw, parse(raw), False

    def read_unlocked(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` with no lock: possibly torn by a concurrent write.

        Only for formats whose checksums find a torn read, read again under the lock then
        (transport/progress.py), on local filesystems, where every process shares one page
        cache. It saves the lock and unlock (~3 µs with Python's share, of a ~75 µs operation).
        """
        try:
            return os.pread(self._fd, size, offset)
        except OSError as exc:
            return retried(exc, lambda: os.pread(self._fd, size, offset))

    def try_read(self, offset: int = 0, size: int | None = None) -> bytes | None:
        """Like ``read``, or None at once if a writer holds the lock: for a watcher that must not
        wait on the process it watches."""
        with self._thread_lock:
            if not _try(self._fd, SHARED):
                return None
            try:
                return self._read_unlocked(offset, size)
            finally:
                self._release()

    def write(self, data: bytes, offset: int = 0) -> None:
        """Overwrite ``len(data)`` bytes at ``offset`` under an exclusive lock."""
        with self._thread_lock:
            self._lock(EXCLUSIVE)
            try:
                self._write_unlocked(data, offset)
            finally:
                self._release()

    def update(self, change: Callable[[bytes], bytes | None]) -> bytes:
        """Replace the whole content with ``change(old)`` atomically; ``None`` keeps it.

        Returns the content in force afterwards. This is the compare-and-set building block.
        """
        with self._thread_lock:
            self._lock(EXCLUSIVE)
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
                self._release()

    def _read_unlocked(self, offset: int, size: int | None) -> bytes:
        if not self._reopen or lock_kind_in_use() != "ofd":  # (closing a descriptor drops POSIX locks)
            return self._read_through(self._fd, offset, size)
        try:
            fresh = open_file(self.path, os.O_RDONLY)
        except FileNotFoundError:  # removed (a finished generation): what it held, as everywhere else
            return self._read_through(self._fd, offset, size)
        try:
            st = os.fstat(fresh)
            if st.st_ino != self._inode:  # another file under its name now: not ours
                return self._read_through(self._fd, offset, size)
            return self._read_through(fresh, offset, size, st)
        finally:
            os.close(fresh)

    def _read_through(self, fd: int, offset: int, size: int | None, st: os.stat_result | None = None) -> bytes:
        """``st``: the descriptor's stat where the caller has it (one fstat per read, not two)."""
        if size is None:
            st = st or os.fstat(fd)
            size = max(0, size_checked(st, self.path, self.max_size, "this record") - offset)
        buffer = bytearray(size)
        view = memoryview(buffer)
        done = 0
        while done < size:  # a record shorter than asked (not yet written) reads short
            try:
                got = os.preadv(fd, [view[done:]], offset + done)
            except OSError as exc:
                got = retried(exc, lambda: os.preadv(fd, [view[done:]], offset + done))
            if got == 0:
                break
            done += got
        return bytes(view[:done])  # one copy: every poll of a peer reads its 8 KiB position part

    def _write_unlocked(self, data: bytes, offset: int) -> None:
        try:
            try:
                written = os.pwrite(self._fd, data, offset)
            except OSError as first:
                written = retried(first, lambda: os.pwrite(self._fd, data, offset))
        except OSError as exc:  # EIO, ENOSPC, EDQUOT...: say which file
            raise OSError(exc.errno, exc.strerror, self.path) from exc
        self._unsynced = self._reopen
        if written != len(data):
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")

    @contextlib.contextmanager
    def held(self, kind: int = EXCLUSIVE) -> Iterator[None]:
        """Hold the lock for a while (a probe testing that it excludes others)."""
        with self._thread_lock:
            self._lock(kind)
            try:
                yield
            finally:
                self._release()

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LockedRecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TornReads:
    """How long reads of one thing have failed their checks without the lock: a read torn by
    the writer's write for TORN_READ_SECONDS at most, past that damaged. The one rule of every
    read that may meet a write (``DirectRecord.read_checked``, and the readers that read a
    slot apart from the header it follows: transport/progress.py, transport/pairs.py)."""

    __slots__ = ("_since",)

    def __init__(self) -> None:
        self._since = 0.0

    def past(self) -> bool:
        """Called on a failed check: whether reads have failed too long to be torn (the caller
        then raises, or takes what it read); the first call starts the clock."""
        now = time.monotonic()
        self._since = self._since or now
        return now - self._since >= TORN_READ_SECONDS


class OptimisticRecord(LockedRecord):
    """A locked record read without the lock first: where every process shares one page cache
    (one machine's own filesystem), a write is seen at once and the lock only costs time."""

    reads_unlocked = True

    def read_checked(
        self, offset: int, size: int, parse: Callable[[bytes], T], plausible: Callable[[T], bool] | None = None,
        locked: bool = False,
    ) -> tuple[bytes, T, bool]:  # fmt: skip
        """As ``LockedRecord.read_checked``, read without the lock first (unless ``locked``): a
        read torn by the writer's write fails a checksum in ``parse`` (ProtocolError), or gives
        what ``plausible`` refuses, and is read again under the lock, which a writer always takes."""
        if not locked:
            raw = self.read_unlocked(offset, size)
            try:
                value = parse(raw)
            except ProtocolError:
                pass  # torn
            else:
                if plausible is None or plausible(value):
                    return raw, value, True
        return super().read_checked(offset, size, parse, plausible)
