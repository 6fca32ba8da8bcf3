"""``python -m fsdist bench locks DIR``: do fcntl locks in DIR really exclude, and how fast are they?

N processes increment one lock-guarded counter (``locked_record.Counter``, the very path the
backend's state records and counters rely on) as fast as they can for S seconds. If the lock
excludes, the final value equals the sum of every process's increments; any shortfall is a
*lost update*: two processes read the same value under what each believed was an exclusive
lock. With ``--peer-mount DIR2`` (another mount of the same directory, e.g. a second NFS mount
with its own client cache) every other process works through DIR2, so the test crosses mounts.

``measure()`` is the reusable core (``doctor`` calls it): processes are forked, so the check
costs milliseconds to start instead of a fresh interpreter and ``import torch`` per process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import statistics
import struct
import sys
import time
from array import array
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

from ..files.io import make_private_dir, remove_tree
from ..files.locks import Counter

__all__ = ["LockBenchResult", "measure"]

_HEADER = struct.Struct("<q")


@dataclass
class LockBenchResult:
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measure(directory: str, procs: int = 4, seconds: float = 2.0, peer_directory: str | None = None) -> LockBenchResult:
    """Run ``procs`` processes incrementing one counter in ``directory`` for ``seconds``.

    With ``peer_directory`` (the same directory mounted elsewhere) odd-numbered processes use
    that path. The counter lives in a fresh private subdirectory, removed afterwards.
    """
    if procs < 1 or seconds <= 0:
        raise ValueError("lock benchmark needs at least one process and a positive duration")
    name = f"fsdist-lockbench-{secrets.token_hex(6)}"
    work = os.path.join(directory, name)
    make_private_dir(work)
    try:
        paths = [os.path.join(work, "counter")]
        if peer_directory is not None:
            peer_work = os.path.join(peer_directory, name)
            if not os.path.isdir(peer_work):
                raise ValueError(f"{peer_directory} is not another mount of {directory}: {name} is not there")
            paths.append(os.path.join(peer_work, "counter"))
        Counter(paths[0]).close()  # create it before anyone races to
        counts, latencies = _run(paths, procs, seconds)
        final = _final_value(paths[0])
    finally:
        remove_tree(work)
    total = sum(counts)
    latencies.sort()
    most = max(counts, default=0)
    return LockBenchResult(
        procs=procs,
        seconds=seconds,
        increments=total,
        final_value=final,
        lost_updates=total - final,
        acquisitions_per_s=total / seconds,
        p50_us=statistics.median(latencies) * 1e6 if latencies else 0.0,
        p99_us=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e6 if latencies else 0.0,
        max_us=latencies[-1] * 1e6 if latencies else 0.0,
        per_process=counts,
        fairness=min(counts) / most if most else 0.0,
        directory=directory,
        peer_directory=peer_directory,
    )


def _final_value(path: str) -> int:
    counter = Counter(path)
    try:
        return counter.get()
    finally:
        counter.close()


def _run(paths: list[str], procs: int, seconds: float) -> tuple[list[int], list[float]]:
    # fork where there is one: no new interpreter, no re-import (spawn costs ~1 s per process)
    ctx: Any = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    start_at = time.monotonic() + 0.2 + 0.02 * procs  # every process starts counting together
    workers, conns = [], []
    for index in range(procs):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(paths[index % len(paths)], start_at, seconds, child), daemon=True)
        proc.start()
        child.close()
        workers.append(proc)
        conns.append(parent)
    counts: list[int] = []
    latencies: list[float] = []
    try:
        for conn, proc in zip(conns, workers, strict=True):
            if not conn.poll(seconds + 60):
                raise RuntimeError(f"lock benchmark process {proc.pid} did not report")
            raw = conn.recv_bytes()
            counts.append(_HEADER.unpack_from(raw)[0])
            samples = array("d")
            samples.frombytes(raw[_HEADER.size :])
            latencies.extend(samples)
    finally:
        for proc in workers:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return counts, latencies


def _worker(path: str, start_at: float, seconds: float, conn: Connection) -> None:
    counter = Counter(path)
    samples = array("d")
    while time.monotonic() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    done = 0
    clock = time.monotonic
    while True:
        before = clock()
        counter.add(1)
        after = clock()
        samples.append(after - before)
        done += 1
        if after >= end:
            break
    counter.close()
    conn.send_bytes(_HEADER.pack(done) + samples.tobytes())
    conn.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="directory to test (a run directory's filesystem)")
    parser.add_argument("-n", "--procs", type=int, default=4, help="processes (default 4)")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long they run (default 2)")
    parser.add_argument("--peer-mount", default=None, metavar="DIR2", help="another mount of DIR: half the processes")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        result = measure(args.directory, args.procs, args.seconds, args.peer_mount)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"fsdist bench locks: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        where = result.directory + (f" and {result.peer_directory}" if result.peer_directory else "")
        print(f"{result.procs} processes × {result.seconds:g} s on {where}")
        print(f"  increments {result.increments}, counter {result.final_value}, lost updates {result.lost_updates}")
        print(f"  {result.acquisitions_per_s:,.0f} acquisitions/s; latency p50 {result.p50_us:.1f} µs, "
              f"p99 {result.p99_us:.1f} µs, max {result.max_us:.0f} µs")  # fmt: skip
        print(f"  per process {result.per_process} (fairness min/max {result.fairness:.2f})")
        if result.lost_updates:
            print("  LOCKS DO NOT EXCLUDE HERE: fsdist is not safe on this directory")
    return 1 if result.lost_updates else 0
