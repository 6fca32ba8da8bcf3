"""One rank of the NFS server-restart check: checked all_reduces while the server restarts.

    python restart_ranks.py DIR RANK WORLD LABEL OPS
Prints "rank R ready" after a few operations (guest.sh then restarts the server), then runs OPS
all_reduces alternating 10 floats (inside the state records) and 64 KiB (message files), each
checked. Ends with "rank R PASS (LABEL, server restart) ..." or "rank R FAIL <type>: <message>":
the job either completes with correct results or fails with a clear error, never a wrong value
(a wrong value would fail the check, as "FAIL WrongResultError").
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import fsdist  # noqa: F401


class WrongResultError(AssertionError):
    """An all_reduce returned a value other than the one every rank's inputs sum to."""


def main() -> None:
    directory, rank, world, label, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    dist.init_process_group("fsdist", init_method=f"fsdist://{directory}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))  # fmt: skip
    want = world * (world + 1) / 2
    start = time.monotonic()
    slowest = 0.0
    for op in range(ops):
        t = torch.full((10 if op % 2 else 16384,), float(rank + 1))
        began = time.monotonic()
        dist.all_reduce(t)
        slowest = max(slowest, time.monotonic() - began)
        if not torch.all(t == want):
            raise WrongResultError(f"all_reduce #{op} gave {t.unique().tolist()[:4]}, not {want}")
        if op == 20:
            print(f"rank {rank} ready", flush=True)
    dist.destroy_process_group()
    print(f"rank {rank} PASS ({label}, server restart) {ops} checked all_reduces in "
          f"{time.monotonic() - start:.1f} s, the slowest {slowest:.1f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # reported to the result file
        print(f"rank {sys.argv[2]} FAIL {type(exc).__name__}: {exc}", flush=True)
        raise
