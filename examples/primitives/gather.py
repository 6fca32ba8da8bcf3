"""gather: every rank's tensor is collected, in rank order, on rank 0 only.

python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/gather.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _common import check, main


def run(rank: int, world: int) -> None:
    mine = torch.tensor([float(rank), float(rank * rank)])
    gathered = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(mine, gather_list=gathered, dst=0)  # only the destination passes the list
    if rank == 0:
        assert gathered is not None
        check([g.tolist() for g in gathered] == [[r, r * r] for r in range(world)], f"got {gathered}")


if __name__ == "__main__":
    main(run)
