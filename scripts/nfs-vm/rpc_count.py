"""One rank of the NFS VM's RPC count: how many NFS RPCs a small all_reduce and a barrier cost.

Usage: rpc_count.py DIR RANK WORLD LABEL OPS PER_MOUNT [flat|tiers]
(ranks 0..PER_MOUNT-1 go through the first mount, the next PER_MOUNT through the second; the
first rank of each mount reads its mount's counters). For each kind of work: a warm-up, a
barrier, the readings, the work on every rank, a closing barrier, the readings again; each
window so also holds one barrier (1/OPS of a barrier's cost). An idle window (every rank asleep)
measures what a rank costs with no op at all: the heartbeat. Then 2 ranks, one per mount (a
group of ranks 0 and PER_MOUNT; the other ranks idle beside them), and large all_reduces and
all_gathers, whose bytes through the server count too (mountstats' "bytes:" line).
``tiers`` (guest.sh sets FSDIST_NODE_ID per mount, so each mount's ranks are one node): the
small ops and a 16 MiB all_reduce only. Each reading's delta is printed as ``RPC {json}``;
mountstats.py makes the tables. Each rank also prints its looks at peers on the other client
per op (files/pacing.py ``REMOTE_LOOKS``: each a READ).
"""

from __future__ import annotations

import collections
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

import fsdist  # noqa: F401
from fsdist.files.pacing import REMOTE_LOOKS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mountstats

WARMUP = 20
IDLE_SECONDS = 10.0
LARGE_OPS = 3  # per size: a large op's RPCs are many, its count steady


class Sampler:
    """Where this rank's operations spend a window: the fsdist frames of its operation thread
    (c10d/work.py runs each op there) sampled every 20 ms; the most frequent stacks are printed
    (a large op's time is seconds in the VM: this says where)."""

    def __init__(self) -> None:
        self._skip = {threading.main_thread().ident, threading.get_ident()}
        self._stacks: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._skip.add(threading.get_ident())
        while not self._stop.wait(0.02):
            for ident, frame in sys._current_frames().items():
                names = []
                while ident not in self._skip and frame is not None and len(names) < 6:
                    code = frame.f_code
                    if "fsdist" in code.co_filename:
                        names.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
                    frame = frame.f_back
                if names and not names[-1].startswith(("liveness.py", "work.py:_run", "receives.py")):
                    self._stacks[" < ".join(names)] += 1

    def report(self, rank: int, kind: str) -> None:
        self._stop.set()
        self._thread.join()
        total = sum(self._stacks.values()) or 1
        for stack, n in self._stacks.most_common(4):
            print(f"rank {rank} {kind}: {100 * n / total:.0f}% in {stack}", flush=True)


def main() -> None:
    directory, rank, world, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ops, per_mount = int(sys.argv[5]), int(sys.argv[6])
    mode = sys.argv[7] if len(sys.argv) > 7 else "flat"
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

    def report(
        kind: str, units: float, seconds: float, before: tuple[dict[str, int] | None, ...], active: int = per_mount
    ) -> None:  # fmt: skip
        """``active``: ranks per mount that did the work (the trace covers ``active`` × 2 ranks)."""
        after = readings()
        for source, old, new, ranks in (
            ("mountstats", before[0], after[0], active),
            ("trace", before[1], after[1], world if active == per_mount else 2 * active),
        ):
            if old is None or new is None:
                continue
            record = {"label": label, "source": source, "mount": mount if source == "mountstats" else "all",
                      "kind": kind, "units": units, "ranks": ranks, "seconds": round(seconds, 3),
                      "delta": mountstats.delta(new, old)}  # fmt: skip
            print("RPC " + json.dumps(record, sort_keys=True), flush=True)

    def window(kind: str, op: Callable[[], None], count: int = ops, warmup: int = WARMUP, active: bool = True,
               per: int = per_mount) -> None:  # fmt: skip
        """``count`` ops (``active``: this rank takes part; ``per``: ranks per mount that do)."""
        for _ in range(warmup if active else 0):
            op()
        dist.barrier()
        before = readings()
        looks = REMOTE_LOOKS.looks
        sampler = Sampler() if count == LARGE_OPS else None
        t0 = time.monotonic()
        for _ in range(count if active else 0):
            op()
        seconds = time.monotonic() - t0
        if sampler is not None:
            sampler.report(rank, kind)
        looked = REMOTE_LOOKS.looks - looks
        dist.barrier()
        report(kind, count, seconds, before, per)
        if active:
            print(f"rank {rank} {kind}: {count} ops in {seconds:.1f} s ({1000 * seconds / count:.0f} ms/op), "
                  f"{looked / count:.2f} looks/op at the other client", flush=True)  # fmt: skip

    t = torch.ones(2)  # 8 bytes of float32

    def all_reduce() -> None:
        t.fill_(1.0)
        dist.all_reduce(t)
        assert torch.all(t == world), "all_reduce"

    window("all_reduce 8 B", all_reduce)
    window("barrier", dist.barrier)
    if mode == "flat":
        dist.barrier()
        before = readings()
        time.sleep(IDLE_SECONDS)
        report(f"idle {IDLE_SECONDS:.0f} s", IDLE_SECONDS, IDLE_SECONDS, before)
        pair = dist.new_group([0, per_mount])  # one rank on each mount
        mine = rank in (0, per_mount)

        def pair_all_reduce() -> None:
            t.fill_(1.0)
            dist.all_reduce(t, group=pair)
            assert torch.all(t == 2), "all_reduce of 2"

        window("2 ranks: all_reduce 8 B", pair_all_reduce, active=mine, per=1)
        window("2 ranks: barrier", lambda: dist.barrier(group=pair), active=mine, per=1)
    for mib in (1, 16) if mode == "flat" else (16,):
        big = torch.ones(mib << 18)  # mib MiB of float32

        def large_all_reduce() -> None:
            big.fill_(1.0)
            dist.all_reduce(big)
            assert torch.all(big == world), "large all_reduce"

        window(f"all_reduce {mib} MiB", large_all_reduce, LARGE_OPS, 1)
        if mode == "flat":
            parts = [torch.empty_like(big) for _ in range(world)]

            def large_all_gather() -> None:
                dist.all_gather(parts, big)

            window(f"all_gather {mib} MiB", large_all_gather, LARGE_OPS, 1)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} PASS ({label}, RPC count) in {time.monotonic() - start:.1f} s", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # reported to the result file
        print(f"rank {sys.argv[2]} FAIL (RPC count) {type(exc).__name__}: {exc}", flush=True)
        raise
