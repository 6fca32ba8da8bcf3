"""The kinds of lock tools use, each guarding a read-increment-write of a plain counter file.

People ask fsdist's lock tools whether locking is safe on their cluster, and most of their tools
lock otherwise than fsdist does: Python tools through ``filelock`` (Hugging Face's hub cache,
pip's and poetry's caches, dataset builders), whose ``FileLock`` is ``flock`` on Unix, local-only
on Lustre without ``-o flock`` and on NFS ``nolock``; others with POSIX ``lockf``; some with a
lock *file* (``SoftFileLock``), which excludes but invalidates no client cache. fs/contention.py
runs the same contention under each:

- ``fsdist``: fsdist's own lock-guarded record (files/locks.py ``Counter``: OFD locks, POSIX
  where the kernel has none) — what its ranks rely on;
- ``ofd``: ``fcntl(F_OFD_SETLKW)`` on a lock file;
- ``posix``: ``fcntl.lockf`` (a classic process-owned POSIX lock);
- ``flock``: ``fcntl.flock``;
- ``filelock`` and ``softfilelock``: the ``filelock`` library's ``FileLock`` and ``SoftFileLock``.

For every kind but ``fsdist`` the counter is an 8-byte file beside the lock, opened afresh under
the lock for each increment and closed before the unlock, as a tool's files are (NFS's
close-to-open consistency then shows the last holder's write wherever the lock excluded).
"""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from ..files.counters import Counter
from ..files.io import open_file, write_new
from ..files.locks import FLOCK

__all__ = ["KINDS", "Incrementer", "incrementer", "prepare", "read_value"]

KINDS = ("fsdist", "ofd", "posix", "flock", "filelock", "softfilelock")
_VALUE = struct.Struct("<q")
_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", None)

#: one lock-guarded increment
Incrementer = Callable[[], None]


def prepare(kind: str, directory: str) -> None:
    """Create the counter (and lock file) of ``kind`` in ``directory``, before anyone races to."""
    if kind == "fsdist":
        Counter(os.path.join(directory, "counter")).close()
        return
    write_new(os.path.join(directory, "value"), [_VALUE.pack(0)])
    if kind != "softfilelock":  # (its lock file exists only while held)
        write_new(os.path.join(directory, "lock"), [b""])


def read_value(kind: str, directory: str) -> int:
    if kind == "fsdist":
        with Counter(os.path.join(directory, "counter")) as counter:
            return counter.get()
    return _read(os.path.join(directory, "value"))


@contextmanager
def incrementer(kind: str, directory: str) -> Any:
    """An ``increment()`` of ``kind``'s counter in ``directory``, for one process (``with``)."""
    if kind not in KINDS:
        raise ValueError(f"lock kind {kind!r}: one of {', '.join(KINDS)}")
    if kind == "fsdist":
        with Counter(os.path.join(directory, "counter")) as counter:
            counter.get()  # open and warm the caches first, as a long-running rank would have
            yield lambda: counter.add(1)
        return
    value = os.path.join(directory, "value")
    with _lock_of(kind, os.path.join(directory, "lock")) as held:

        def increment() -> None:
            with held():
                fd = open_file(value, os.O_RDWR)
                try:
                    current = _VALUE.unpack(os.pread(fd, _VALUE.size, 0))[0]
                    os.pwrite(fd, _VALUE.pack(current + 1), 0)
                finally:
                    os.close(fd)  # before the unlock: on NFS, close is where the write reaches the server

        yield increment


def _lock_of(kind: str, path: str) -> AbstractContextManager[Callable[[], AbstractContextManager[None]]]:
    """A context that keeps what ``kind`` holds open, giving the ``with``-able lock itself."""
    if kind in ("filelock", "softfilelock"):
        import filelock  # (the library itself: what the tools in question use)

        # (a bounded wait: a soft lock whose holder died stays held for ever)
        kind_of = filelock.FileLock if kind == "filelock" else filelock.SoftFileLock
        library = kind_of(path, timeout=120)
        return _kept(lambda: library)
    return _fcntl_lock(kind, path)


@contextmanager
def _kept(lock: Callable[[], Any]) -> Any:
    yield lock


@contextmanager
def _fcntl_lock(kind: str, path: str) -> Any:
    fd = open_file(path, os.O_RDWR)
    try:

        @contextmanager
        def held() -> Any:
            _set(kind, fd, exclusive=True)
            try:
                yield
            finally:
                _set(kind, fd, exclusive=False)

        yield held
    finally:
        os.close(fd)


def _set(kind: str, fd: int, exclusive: bool) -> None:
    if kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_UN)
    elif kind == "posix":
        fcntl.lockf(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_UN)
    else:  # ofd
        if _OFD_SETLKW is None:
            raise OSError("this kernel has no OFD locks (F_OFD_SETLKW)")
        fcntl.fcntl(fd, _OFD_SETLKW, FLOCK.pack(fcntl.F_WRLCK if exclusive else fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0))


def _read(path: str) -> int:
    fd = open_file(path, os.O_RDONLY)
    try:
        return int(_VALUE.unpack(os.pread(fd, _VALUE.size, 0))[0])
    finally:
        os.close(fd)
