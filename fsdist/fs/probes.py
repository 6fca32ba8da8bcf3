"""Short measurements of the filesystem properties fsdist relies on (``fsdist doctor`` runs them).

Each probe works in a scratch folder reached through mount A and, when given, through a second
mount B of the same directory (a second client: another node, or a second mount on this host).
Processes, not threads: fcntl locks belong to processes. Each probe does a fixed, small amount
of work with a time cap, so the whole set takes a few seconds even on a slow filesystem.
This is a focused probe, not the lock benchmark (``fsdist bench locks``).
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing as mp
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

from ..files.counters import Counter, decode_counter, encode_counter
from ..files.direct import DirectRecord
from ..files.io import open_file, publish, read_file, unlink_quietly
from ..files.locks import EXCLUSIVE, LockedRecord, lock, lock_kind_in_use, try_lock, unlock

__all__ = [
    "LockSemantics",
    "direct_visibility",
    "lock_exclusion",
    "lock_semantics",
    "new_file_visibility",
    "rename_atomicity",
    "rewrite_visibility",
]


def _ctx() -> Any:
    return mp.get_context("fork")  # no re-import (torch) per worker; the probes start no threads


def direct_visibility(path_a: str, path_b: str, rounds: int = 2) -> str | None:
    """None if what a direct write through A puts in a file, a direct read through B shows at
    once, every round (B has read the file before each later round, so a cache behind O_DIRECT
    shows); else why not. What FSDIST_IO=auto measures across a job's clients (job/io_choice.py)."""
    why = DirectRecord.refusal(os.path.dirname(path_a))
    if why is not None:
        return why
    with contextlib.closing(DirectRecord(path_a)) as writer:
        reader: DirectRecord | None = None
        try:
            for round_ in range(rounds):
                nonce = secrets.token_hex(16).encode()
                writer.write(nonce)
                reader = reader or DirectRecord(path_b, create=False)
                seen = reader.read(0, len(nonce))
                if seen != nonce:
                    return f"a direct read through B showed an older write than A's (round {round_ + 1})"
        finally:
            if reader is not None:
                reader.close()
    return None


def lock_exclusion(path_a: str, path_b: str) -> bool:
    """Does an exclusive fcntl lock taken through A stop a lock attempt through B?"""
    with LockedRecord(path_a) as holder, holder.held():  # the kind of lock fsdist takes (OFD where it can)
        ctx = _ctx()
        result = ctx.Queue()
        proc = ctx.Process(target=_try_lock, args=(path_b, result))
        proc.start()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
            return True  # it hung waiting for the lock: excluded
        return bool(result.get(timeout=1))


def _try_lock(path: str, result: Any) -> None:
    fd = open_file(path, os.O_RDWR)
    try:
        result.put(not try_lock(fd))  # taken while the other mount held it: no exclusion
    except OSError as exc:
        result.put(exc.errno in (errno.EAGAIN, errno.EACCES))
    finally:
        os.close(fd)


def rename_atomicity(dir_a: str, dir_b: str, size: int = 1 << 20, seconds: float = 0.5) -> tuple[int, int, int]:
    """A writer republishes a file through A (temp + rename, each version one byte value)
    while a reader reads it through B. Returns (reads, torn or short reads, ESTALE errors)."""
    name = "rename-probe"
    publish(dir_a, name, [bytes([0]) * size])
    ctx = _ctx()
    stop = ctx.Event()
    writer = ctx.Process(target=_republish, args=(dir_a, name, size, stop))
    writer.start()
    reads = torn = stale = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            try:
                data = read_file(os.path.join(dir_b, name), size, "the probe's file")
            except FileNotFoundError:
                torn += 1  # rename must never leave the name missing
                continue
            except OSError as exc:
                if exc.errno == errno.ESTALE:
                    stale += 1
                    continue
                raise
            reads += 1
            if len(data) != size or data.count(data[:1]) != size:
                torn += 1
    finally:
        stop.set()
        writer.join(10)
        unlink_quietly(os.path.join(dir_a, name))
    return reads, torn, stale


def _republish(directory: str, name: str, size: int, stop: Any) -> None:
    version = 0
    while not stop.is_set():
        version = (version + 1) % 256
        publish(directory, name, [bytes([version]) * size])


def new_file_visibility(dir_a: str, dir_b: str, limit: float = 3.0) -> tuple[float | None, float | None]:
    """Seconds until a file created through A is seen through B: by ``stat`` of its name
    (after B looked the name up while it did not exist, as a naive waiter would) and by
    listing the directory. None: not seen within ``limit``."""
    results: list[float | None] = []
    for how in ("stat", "listdir"):
        name = f"new-{how}-{os.getpid()}-{time.monotonic_ns()}"
        target = os.path.join(dir_b, name)
        if how == "stat":
            os.path.exists(target)  # primes a negative lookup cache where there is one
        publish(dir_a, name, [b"x"])
        start = time.monotonic()
        seen: float | None = None
        while time.monotonic() - start < limit:
            if (os.path.exists(target)) if how == "stat" else (name in os.listdir(dir_b)):
                seen = time.monotonic() - start
                break
            time.sleep(0.002)
        results.append(seen)
        unlink_quietly(os.path.join(dir_a, name))
    return results[0], results[1]


def rewrite_visibility(
    path_a: str, path_b: str, rounds: int = 5, limit: float = 3.0
) -> tuple[float | None, float | None]:
    """Worst seconds until a value rewritten in place through A (under the lock) is read
    through B: by a descriptor held open and read under a shared lock (what fsdist's state
    records do), and by re-opening the file. None: some rewrite was not seen within ``limit``."""
    writer = LockedRecord(path_a)
    writer.write(encode_counter(0, path_a))
    held = LockedRecord(path_b)
    try:
        held.read(0, Counter.SIZE)  # warm B's caches with the old value, as a long-lived reader has
        worst: list[float | None] = [0.0, 0.0]
        value = 0
        for how in (0, 1):
            for _ in range(rounds):
                value += 1
                writer.write(encode_counter(value, path_a))
                took = _until_read(held if how == 0 else None, path_b, value, limit)
                current = worst[how]
                worst[how] = None if took is None or current is None else max(current, took)
                if worst[how] is None:
                    break  # one rewrite never seen says enough
        return worst[0], worst[1]
    finally:
        writer.close()
        held.close()


def _until_read(held: LockedRecord | None, path: str, value: int, limit: float) -> float | None:
    """Seconds until a read under the lock (through ``held``, else a fresh open) that shows
    ``value`` began: how long old data was served, 0 when the first read showed the rewrite,
    however long that read's lock took (NFS-Ganesha v3 in a busy VM: one lock round trip of
    0.10 s made a coherent server look stale against doctor's 0.1 s)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        began = time.monotonic()
        if held is not None:
            raw = held.read(0, Counter.SIZE)
        else:
            with LockedRecord(path, create=False) as fresh:
                raw = fresh.read(0, Counter.SIZE)
        if len(raw) == Counter.SIZE and decode_counter(raw, path) == value:
            return began - start
        time.sleep(0.001)
    return None


@dataclass(frozen=True)
class LockSemantics:
    """What fsdist's lock does on one filesystem (``lock_semantics``): the answers that decide
    whether its kind of lock is safe there. FUSE hands an OFD lock to its daemon as a plain lock
    request, and its release when a descriptor closes needed a kernel change (Linux 6.x), so on a
    FUSE filesystem these are measured, not assumed."""

    #: which lock fsdist took: "ofd" (F_OFD_SETLK), or "posix" where the kernel or filesystem has none
    kind: str
    #: a second descriptor of the *same* process is refused while the first holds the lock (the
    #: OFD promise; POSIX locks belong to the process, so there it is expected False)
    same_process_excludes: bool
    #: another process can take it once the holder *closed* its descriptor (still alive)
    released_at_close: bool
    #: another process can take it once the holder was killed with SIGKILL
    released_at_death: bool

    def problems(self) -> list[str]:
        """What would go wrong with fsdist's locks here; empty when nothing."""
        out = []
        if self.kind == "ofd" and not self.same_process_excludes:
            out.append("an OFD lock did not exclude a second descriptor of the same process")
        if not self.released_at_close:
            out.append("a lock outlived the descriptor that held it (closed, process alive)")
        if not self.released_at_death:
            out.append("a lock outlived its process (SIGKILL): the next job would wait for it")
        return out


def lock_semantics(path: str, wait: float = 3.0) -> LockSemantics:
    """Measure fsdist's lock (files/locks.py: OFD where taken, else POSIX) on ``path``'s
    filesystem: same-process exclusion, release at close, release at process death. A release
    is looked for for ``wait`` seconds (a FUSE daemon may hand it on late)."""
    with LockedRecord(path) as first, first.held():
        kind = lock_kind_in_use()
        fd = open_file(path, os.O_RDWR)
        try:
            same_process_excludes = not try_lock(fd)
            if not same_process_excludes:
                unlock(fd)
        finally:
            os.close(fd)
    # a file each: a lock left behind by one measurement must not decide the next
    released_at_close = _released(f"{path}.close", wait, close=True)
    released_at_death = _released(f"{path}.death", wait, close=False)
    return LockSemantics(kind, same_process_excludes, released_at_close, released_at_death)


def _released(path: str, wait: float, close: bool) -> bool:
    """Can this process take the lock a child took, once the child closed its descriptor (still
    alive) or was killed with SIGKILL? Each child reports through a pipe of its own: a queue
    shared with a process killed mid-put stays locked for the next one."""
    LockedRecord(path).close()
    ctx = _ctx()
    ready, report = ctx.Pipe(duplex=False)
    holder = ctx.Process(target=_hold, args=(path, report, close), daemon=True)
    holder.start()
    report.close()
    try:
        if not ready.poll(10) or not ready.recv():
            raise RuntimeError(f"a process could not take the lock on {path}")
        if not close:
            holder.kill()
            holder.join()
        return _eventually_taken(path, wait)
    finally:
        ready.close()
        holder.kill()
        holder.join()


def _hold(path: str, report: Any, close: bool) -> None:
    """Take fsdist's lock on ``path``; close the descriptor if asked; say so (True, or False if
    it failed); then stay alive until killed."""
    try:
        record = LockedRecord(path, create=False)
        lock(record.fileno(), EXCLUSIVE, path)
        if close:
            record.close()
        report.send(True)
    except Exception:  # noqa: BLE001 - the parent raises
        report.send(False)
        return
    time.sleep(60)


def _eventually_taken(path: str, wait: float) -> bool:
    fd = open_file(path, os.O_RDWR)
    try:
        end = time.monotonic() + wait
        while True:
            if try_lock(fd):
                unlock(fd)
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
    finally:
        os.close(fd)
