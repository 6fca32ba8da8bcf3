"""Counting the filesystem calls a rank makes per operation: measured, not estimated.

On NFS every open, lock, unlock, rename, unlink and stat is a round trip to the server, so they
are counted like bytes. fsdist is pure Python: every call it makes to the kernel goes through
``os``, ``fcntl``, ``mmap`` or ``select``. While counting, those functions are replaced by
counting wrappers (in this benchmark process only), so the calls of every thread (the caller's,
the worker's, the receive thread's, the heartbeat's) are seen, whatever module made them.
Gloo makes its calls from C++ and is not seen: its column shows what Python did around it.

Kinds, in the order the report shows them: ``lock`` (fcntl locks and unlocks), ``open``,
``close``, ``rename``, ``unlink``, ``stat``, ``read``, ``write``, ``mmap``, ``dir`` (mkdir,
rmdir, listing, link), ``wake`` (a byte written to or drained from a doorbell FIFO) and
``wait`` (select on a doorbell FIFO) and ``proc`` (a read of ``/proc``: the run queue a waiter
checks before it spins): the last three never leave the machine.

With ``local_root`` (``bench --nodes``: each simulated node's FSDIST_LOCAL_DIR), a call on a file
under it counts as ``local <kind>``, apart from the shared directory's; ``bytes`` (and ``local
bytes``) add up what the writes wrote.
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

from ...transport.spares import SpareFile

__all__ = ["KINDS", "REMOTE_KINDS", "counting"]

KINDS = ("lock", "open", "close", "rename", "unlink", "stat", "read", "write", "mmap", "dir", "wake", "wait", "proc")
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
def counting(local_root: str | None = None) -> Iterator[Counter[str]]:
    """Count every filesystem call of this process, by kind, while the block runs (and, with
    ``local_root``, those on files under it apart: see the module docstring)."""
    counts: Counter[str] = Counter()
    guard = threading.Lock()
    originals: list[tuple[Any, str, Any]] = []
    roots = tuple({os.path.join(r, "") for r in (local_root, os.path.realpath(local_root))}) if local_root else ()
    #: fd -> "local " for a file under local_root, else "" (forgotten when the fd is closed)
    place: dict[int, str] = {}
    real_readlink = os.readlink

    def path_place(path: Any) -> str:
        if not roots or not isinstance(path, (str, bytes, os.PathLike)):
            return ""
        text = os.fsdecode(os.fspath(path))
        return "local " if text.startswith(roots) else ""

    def fd_place(fd: Any) -> str:
        if hasattr(fd, "fileno"):
            fd = fd.fileno()
        if not roots or not isinstance(fd, int):
            return ""
        if fd not in place:  # opened before counting began (state records stay open)
            try:
                place[fd] = path_place(real_readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                place[fd] = ""
        return place[fd]

    def counted(function: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else None
            where = fd_place(first) if isinstance(first, int) or hasattr(first, "fileno") else path_place(first)
            with guard:
                counts[where + kind] += 1
            return function(*args, **kwargs)

        return wrapper

    def open_counted(function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
            where = path_place(path)
            with guard:
                counts[where + "open"] += 1
            fd = function(path, *args, **kwargs)
            if roots:
                place[fd] = where
            return fd

        return wrapper

    #: fd -> the kind its reads and writes count as where it stays on the machine ("wake": a
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
            return "wake"
        return "proc" if status.st_dev == proc_device else None

    def data_counted(function: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def wrapper(fd: int, *args: Any, **kwargs: Any) -> Any:
            where = fd_place(fd)
            with guard:
                if fd not in local:
                    local[fd] = local_kind(fd)
                counts[local[fd] or where + kind] += 1
            result = function(fd, *args, **kwargs)
            if kind == "write" and not local[fd] and isinstance(result, int):
                with guard:
                    counts[where + "bytes"] += result
            return result

        return wrapper

    def close_counted(fd: int) -> None:
        where = fd_place(fd)
        with guard:
            counts[where + "close"] += 1
            local.pop(fd, None)
            place.pop(fd, None)
        real_close(fd)

    def fcntl_counted(function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(fd: Any, command: int, *args: Any) -> Any:
            where = fd_place(fd)
            with guard:
                counts[where + ("lock" if command in _LOCK_COMMANDS else "stat")] += 1
            return function(fd, command, *args)

        return wrapper

    def spare_counted(function: Callable[..., Any]) -> Callable[..., Any]:
        """A reused file is rewritten through its mapping, not ``write``: its bytes count here."""

        def wrapper(spare: SpareFile, final: str, buffers: Any) -> None:
            function(spare, final, buffers)
            with guard:
                counts[path_place(final) + "bytes"] += sum(len(b) for b in buffers)

        return wrapper

    try:
        for module, name, kind in _COUNTED:
            original = getattr(module, name)
            originals.append((module, name, original))
            if module is mmap:
                replacement: Any = _counted_class(original, counts, guard, fd_place)
            elif name == "close":
                replacement = close_counted
            elif name == "open":
                replacement = open_counted(original)
            elif kind in ("read", "write") and name not in ("fsync", "ftruncate"):
                replacement = data_counted(original, kind)
            else:
                replacement = counted(original, kind)
            setattr(module, name, replacement)
        originals.append((fcntl, "fcntl", fcntl.fcntl))
        fcntl.fcntl = fcntl_counted(fcntl.fcntl)
        originals.append((SpareFile, "publish", SpareFile.publish))
        SpareFile.publish = spare_counted(SpareFile.publish)  # type: ignore[method-assign]
        yield counts
    finally:
        for module, name, original in reversed(originals):
            setattr(module, name, original)


def _counted_class(cls: type, counts: Counter[str], guard: threading.Lock, fd_place: Callable[[Any], str]) -> type:
    """``mmap.mmap`` is a class that code also uses in isinstance checks: count through a subclass."""

    class Counted(cls):
        def __new__(klass, *args: Any, **kwargs: Any) -> Any:
            where = fd_place(args[0]) if args else ""
            with guard:
                counts[where + "mmap"] += 1
            return cls.__new__(klass, *args, **kwargs)

    Counted.__name__ = cls.__name__
    return Counted
