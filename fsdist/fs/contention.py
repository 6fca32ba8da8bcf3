"""Processes contending for one lock-guarded counter: lost updates, rate, latency, fairness.

N processes increment one counter as fast as they can, under one kind of lock (fs/lock_kinds.py:
fsdist's own ``files.counters.Counter`` by default, the very path its state records and counters
rely on; or OFD, POSIX, ``flock``, ``filelock``'s, as other tools lock). If the lock excludes,
the final value equals the sum of every process's own count; any shortfall is a *lost update*:
two processes read the same value under what each believed was an exclusive lock. With a peer
directory (the same directory through another mount, i.e. another client) every other process
works through it, so the test crosses clients. ``fsdist doctor`` runs it briefly, ``fsdist bench locks`` at length.

Processes are forked where possible: the check costs milliseconds to start instead of a fresh
interpreter (and its imports) per process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import struct
import time
from array import array
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ..files.io import remove_tree
from ..files.places import resolve_place
from ..files.trust import make_private_dir
from . import lock_kinds

__all__ = ["Contention", "contend", "measure"]

_HEADER = struct.Struct("<qd")  # increments made, seconds spent making them
_START = struct.Struct("<d")  # the monotonic time every process starts counting at
_READY = b"ready"  # a process opened its counter
_LONGEST_SECONDS = 10.0  # how much longer than asked a count may run to reach its least increments
_READY_SECONDS = 60.0  # how long opening the counter may take (a FUSE mount's first open: seconds)


@dataclass
class Contention:
    """What N processes hammering one lock-guarded counter found."""

    procs: int
    seconds: float
    increments: int  # sum of every process's own count of increments
    final_value: int  # what the counter says at the end
    lost_updates: int  # increments - final_value: must be 0 where locking works
    acquisitions_per_s: float
    p50_us: float  # per increment: lock, read, write, unlock
    p99_us: float
    max_us: float
    per_process: list[int]
    fairness: float  # min / max increments per process (1.0: perfectly fair)
    directory: str
    peer_directory: str | None
    kind: str = "fsdist"  # the lock (fs/lock_kinds.py)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measure(
    directory: str, procs: int = 4, seconds: float = 2.0, peer_directory: str | None = None, kind: str = "fsdist"
) -> Contention:
    """Contend for a counter in a fresh private folder of ``directory`` (removed afterwards),
    under the lock ``kind`` (fs/lock_kinds.py).

    With ``peer_directory`` (the same directory mounted elsewhere) odd-numbered processes reach
    the counter through that path.
    """
    name = f"fsdist-lockbench-{secrets.token_hex(6)}"
    # resolved as a run directory is: nothing untrusted on the way could swap the folder mid-run
    work = resolve_place(os.path.join(directory, name))
    make_private_dir(work)
    try:
        folders = [work]
        if peer_directory is not None:
            if name not in os.listdir(peer_directory):  # a listing revalidates NFS's lookup cache
                raise ValueError(f"{peer_directory} is not another mount of {directory}: {name} is not there")
            folders.append(os.path.join(peer_directory, name))
        result = contend(folders, procs, seconds, kind=kind)
    finally:
        remove_tree(work)
    result.directory, result.peer_directory = directory, peer_directory
    return result


def contend(
    folders: list[str],
    procs: int,
    seconds: float,
    max_increments: int | None = None,
    kind: str = "fsdist",
    min_increments: int = 0,
) -> Contention:
    """``procs`` processes increment the counter of ``kind`` in ``folders`` (one folder, process i
    through ``folders[i % len(folders)]``) for ``seconds``, or until each made ``max_increments``;
    past ``seconds`` (up to _LONGEST_SECONDS more) until each made ``min_increments``: doctor's
    verdict needs enough of them, and the first seconds on a fresh mount can be slow (MooseFS:
    5 increments in doctor's 1 s once, ~450 a second after)."""
    if procs < 1 or seconds <= 0:
        raise ValueError("lock contention needs at least one process and a positive duration")
    if kind not in lock_kinds.KINDS:
        raise ValueError(f"lock kind {kind!r}: one of {', '.join(lock_kinds.KINDS)}")
    lock_kinds.prepare(kind, folders[0])  # before anyone races to
    counts, spent, latencies = _run(folders, procs, seconds, (min_increments, max_increments), kind)
    final = lock_kinds.read_value(kind, folders[0])
    total = sum(counts)
    most = max(counts, default=0)
    p50, p99, top = np.percentile(latencies, [50, 99, 100]) * 1e6 if latencies else (0.0, 0.0, 0.0)
    return Contention(
        procs=procs,
        seconds=seconds,
        increments=total,
        final_value=final,
        lost_updates=total - final,
        acquisitions_per_s=total / max(spent, default=seconds),
        p50_us=float(p50),
        p99_us=float(p99),
        max_us=float(top),
        per_process=counts,
        fairness=min(counts) / most if most else 0.0,
        directory=folders[0],
        peer_directory=folders[1] if len(folders) > 1 else None,
        kind=kind,
    )


def _run(
    folders: list[str], procs: int, seconds: float, bounds: tuple[int, int | None], kind: str
) -> tuple[list[int], list[float], list[float]]:
    """Each process's increments, its seconds spent on them, and every increment's latency."""
    # fork where there is one: no new interpreter, no re-import (spawn costs ~1 s per process)
    ctx: Any = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    workers, conns = [], []
    for index in range(procs):
        parent, child = ctx.Pipe()
        folder = folders[index % len(folders)]
        proc = ctx.Process(target=_worker, args=(kind, folder, seconds, bounds, child), daemon=True)
        proc.start()
        child.close()
        workers.append(proc)
        conns.append(parent)
    counts: list[int] = []
    spent: list[float] = []
    latencies: list[float] = []
    try:
        # every process starts counting together, once all have opened the counter: a fixed head
        # start was too short on MooseFS, whose first open through a second mount took ~3 s, and
        # the processes then counted 5 increments in all where they make ~800 a second
        for conn, proc in zip(conns, workers, strict=True):
            if not conn.poll(_READY_SECONDS) or _receive(conn, proc) != _READY:
                raise RuntimeError(f"lock benchmark process {proc.pid} did not open its counter in {_READY_SECONDS} s")
        start_at = time.monotonic() + 0.01  # (one clock for every process of this machine)
        for conn in conns:
            conn.send_bytes(_START.pack(start_at))
        for conn, proc in zip(conns, workers, strict=True):
            if not conn.poll(seconds + _LONGEST_SECONDS + 60):
                raise RuntimeError(f"lock benchmark process {proc.pid} did not report")
            raw = _receive(conn, proc)
            done, took = _HEADER.unpack_from(raw)
            counts.append(done)
            spent.append(took)
            samples = array("d")
            samples.frombytes(raw[_HEADER.size :])
            latencies.extend(samples)
    finally:
        for proc in workers:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return counts, spent, latencies


def _receive(conn: Connection, proc: Any) -> bytes:
    """The next message from a worker, or an error saying that it died (its traceback is above)."""
    try:
        return conn.recv_bytes()
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"lock benchmark process {proc.pid} failed (exit code {proc.exitcode})") from None


def _worker(kind: str, folder: str, seconds: float, bounds: tuple[int, int | None], conn: Connection) -> None:
    least, most = bounds
    samples = array("d")
    done = 0
    with lock_kinds.incrementer(kind, folder) as increment:
        conn.send_bytes(_READY)
        if not conn.poll(_READY_SECONDS + 10):
            return  # the parent gave up on a slower process
        (start_at,) = _START.unpack(conn.recv_bytes())
        while time.monotonic() < start_at:
            time.sleep(0.001)
        end, last = start_at + seconds, start_at + seconds + _LONGEST_SECONDS
        clock = time.monotonic
        while True:
            before = clock()
            increment()
            after = clock()
            samples.append(after - before)
            done += 1
            if (after >= end and done >= least) or done == most or after >= last:
                break
    conn.send_bytes(_HEADER.pack(done, after - start_at if done else 0.0) + samples.tobytes())
    conn.close()
