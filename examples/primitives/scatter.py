"""scatter: rank 0 holds one tensor per rank; rank i receives the i-th.

python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/scatter.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _common import check, main


def run(rank: int, world: int) -> None:
    out = torch.zeros(2)
    pieces = [torch.full((2,), float(i * 100)) for i in range(world)] if rank == 0 else None
    dist.scatter(out, scatter_list=pieces, src=0)  # only the source passes the list
    check(out.tolist() == [rank * 100.0] * 2, f"got {out.tolist()}")


if __name__ == "__main__":
    main(run)
