"""Counting the filesystem calls a rank makes per operation: measured, not estimated.

On NFS every open, lock, unlock, rename, unlink and stat is a round trip to the server, so they
are counted like bytes. fsdist is pure Python: every call it makes to the kernel goes through
``os``, ``fcntl``, ``mmap`` or ``select``. While counting, those functions are replaced by
counting wrappers (in this benchmark process only), so the calls of every thread (the caller's,
the worker's, the receive thread's, the heartbeat's) are seen, whatever module made them.
Gloo makes its calls from C++ and is not seen: its column shows what Python did around it.

Kinds, in the order the report shows them: ``lock`` (fcntl locks and unlocks), ``open``,
``close``, ``rename``, ``unlink``, ``stat``, ``read``, ``write``, ``mmap``, ``dir`` (mkdir,
rmdir, listing, link), ``ring`` (a byte written to or drained from a doorbell FIFO) and
``wait`` (select on a doorbell FIFO) and ``proc`` (a read of ``/proc``: the run queue a waiter
checks before it spins): the last three never leave the machine.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import select
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["KINDS", "REMOTE_KINDS", "counting"]

KINDS = ("lock", "open", "close", "rename", "unlink", "stat", "read", "write", "mmap", "dir", "ring", "wait", "proc")
#: what reaches a network filesystem's server (rings and waits stay on the machine)
REMOTE_KINDS = KINDS[:10]

#: (module, function name, kind); fcntl.fcntl is a lock only for the locking commands
_COUNTED: list[tuple[Any, str, str]] = [
    *((os, name, "open") for name in ("open",)),
    *((os, name, "close") for name in ("close",)),
    *((os, name, "rename") for name in ("rename", "replace")),
    *((os, name, "unlink") for name in ("unlink", "remove")),
    *((os, name, "stat") for name in ("stat", "lstat", "fstat")),
    *((os, name, "read") for name in ("read", "pread", "readv", "preadv", "readinto") if hasattr(os, name)),
    *((os, name, "write") for name in ("write", "pwrite", "writev", "pwritev", "ftruncate", "fsync")),
    *((os, name, "dir") for name in ("mkdir", "rmdir", "listdir", "scandir", "link")),
    (fcntl, "lockf", "lock"),
    (fcntl, "flock", "lock"),
    (mmap, "mmap", "mmap"),
    (select, "select", "wait"),
]
_LOCK_COMMANDS = {
    getattr(fcntl, name)
    for name in ("F_SETLK", "F_SETLKW", "F_GETLK", "F_OFD_SETLK", "F_OFD_SETLKW", "F_OFD_GETLK")
    if hasattr(fcntl, name)
}


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """Count every filesystem call of this process, by kind, while the block runs."""
    counts: Counter[str] = Counter()
    guard = threading.Lock()
    originals: list[tuple[Any, str, Any]] = []

    def counted(function: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with guard:
                counts[kind] += 1
            return function(*args, **kwargs)

        return wrapper

    #: fd -> the kind its reads and writes count as where it stays on the machine ("ring": a
    #: FIFO, "proc": a /proc file), else None (forgotten when the fd is closed)
    local: dict[int, str | None] = {}
    real_fstat, real_close = os.fstat, os.close
    try:
        proc_device: int | None = os.stat("/proc").st_dev
    except OSError:
        proc_device = None

    def local_kind(fd: int) -> str | None:
        try:
            status = real_fstat(fd)
        except OSError:
            return None
        if stat.S_ISFIFO(status.st_mode):
            return "ring"
        return "proc" if status.st_dev == proc_device else None

    def data_counted(function: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def wrapper(fd: int, *args: Any, **kwargs: Any) -> Any:
            with guard:
                if fd not in local:
                    local[fd] = local_kind(fd)
                counts[local[fd] or kind] += 1
            return function(fd, *args, **kwargs)

        return wrapper

    def close_counted(fd: int) -> None:
        with guard:
            counts["close"] += 1
            local.pop(fd, None)
        real_close(fd)

    def fcntl_counted(function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(fd: Any, command: int, *args: Any) -> Any:
            with guard:
                counts["lock" if command in _LOCK_COMMANDS else "stat"] += 1
            return function(fd, command, *args)

        return wrapper

    try:
        for module, name, kind in _COUNTED:
            original = getattr(module, name)
            originals.append((module, name, original))
            if module is mmap:
                replacement: Any = _counted_class(original, counts, guard)
            elif name == "close":
                replacement = close_counted
            elif kind in ("read", "write") and name not in ("fsync", "ftruncate"):
                replacement = data_counted(original, kind)
            else:
                replacement = counted(original, kind)
            setattr(module, name, replacement)
        originals.append((fcntl, "fcntl", fcntl.fcntl))
        fcntl.fcntl = fcntl_counted(fcntl.fcntl)
        yield counts
    finally:
        for module, name, original in reversed(originals):
            setattr(module, name, original)


def _counted_class(cls: type, counts: Counter[str], guard: threading.Lock) -> type:
    """``mmap.mmap`` is a class that code also uses in isinstance checks: count through a subclass."""

    class Counted(cls):
        def __new__(klass, *args: Any, **kwargs: Any) -> Any:
            with guard:
                counts["mmap"] += 1
            return cls.__new__(klass, *args, **kwargs)

    Counted.__name__ = cls.__name__
    return Counted
