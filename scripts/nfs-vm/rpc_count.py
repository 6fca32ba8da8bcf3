"""One rank of the NFS VM's RPC count: how many NFS RPCs a small all_reduce and a barrier cost.

Usage: rpc_count.py DIR RANK WORLD LABEL OPS PER_MOUNT
(ranks 0..PER_MOUNT-1 go through the first mount, the next PER_MOUNT through the second; the
first rank of each mount reads its mount's counters). For each kind of work: a warm-up, a
barrier, the readings, the work on every rank, a closing barrier, the readings again; each
window so also holds one barrier (1/OPS of a barrier's cost). An idle window (every rank asleep)
measures what a rank costs with no op at all: the heartbeat (a locked counter, once a second).
Each reading's delta is printed as ``RPC {json}``; mountstats.py makes the tables.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

import fsdist  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mountstats

WARMUP = 20
IDLE_SECONDS = 10.0


def main() -> None:
    directory, rank, world, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ops, per_mount = int(sys.argv[5]), int(sys.argv[6])
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    mount = os.path.dirname(os.path.abspath(directory))
    leader = rank % per_mount == 0  # the first rank on its mount reads that mount's counters
    start = time.monotonic()
    dist.init_process_group("fsdist", init_method=f"fsdist://{directory}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))  # fmt: skip
    print(f"rank {rank} +{time.monotonic() - start:.1f} s joined (RPC count, {mount})", flush=True)
    if rank == 0 and mountstats.trace_counts() is None:
        print("rank 0: no rpc_request histogram (tracefs or the trigger missing): NFS ops only", flush=True)

    def readings() -> tuple[dict[str, int] | None, dict[str, int] | None]:
        try:
            ms = mountstats.mount_ops(mount) if leader else None
        except KeyError:  # not an NFS mount (a dry run on local disk): the trace histogram only
            ms = None
        tr = mountstats.trace_counts() if rank == 0 else None
        return ms, tr

    def report(kind: str, units: float, seconds: float, before: tuple[dict[str, int] | None, ...]) -> None:
        after = readings()
        for source, old, new, ranks in (
            ("mountstats", before[0], after[0], per_mount),
            ("trace", before[1], after[1], world),
        ):
            if old is None or new is None:
                continue
            record = {"label": label, "source": source, "mount": mount if source == "mountstats" else "all",
                      "kind": kind, "units": units, "ranks": ranks, "seconds": round(seconds, 3),
                      "delta": mountstats.delta(new, old)}  # fmt: skip
            print("RPC " + json.dumps(record, sort_keys=True), flush=True)

    def window(kind: str, op: Callable[[], None]) -> None:
        for _ in range(WARMUP):
            op()
        dist.barrier()
        before = readings()
        t0 = time.monotonic()
        for _ in range(ops):
            op()
        dist.barrier()
        seconds = time.monotonic() - t0
        report(kind, ops, seconds, before)
        print(f"rank {rank} {kind}: {ops} ops in {seconds:.1f} s ({1000 * seconds / ops:.0f} ms/op)", flush=True)

    t = torch.ones(2)  # 8 bytes of float32

    def all_reduce() -> None:
        t.fill_(1.0)
        dist.all_reduce(t)
        assert torch.all(t == world), "all_reduce"

    window("all_reduce 8 B", all_reduce)
    window("barrier", dist.barrier)
    dist.barrier()
    before = readings()
    time.sleep(IDLE_SECONDS)
    report(f"idle {IDLE_SECONDS:.0f} s", IDLE_SECONDS, IDLE_SECONDS, before)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} PASS ({label}, RPC count) in {time.monotonic() - start:.1f} s", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # reported to the result file
        print(f"rank {sys.argv[2]} FAIL (RPC count) {type(exc).__name__}: {exc}", flush=True)
        raise
