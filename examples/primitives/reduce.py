"""reduce: the element-wise sum of every rank's tensor arrives on rank 0 only.

python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/reduce.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _common import check, main


def run(rank: int, world: int) -> None:
    tensor = torch.tensor([1.0, float(rank)])
    dist.reduce(tensor, dst=0, op=dist.ReduceOp.SUM)
    if rank == 0:  # on the other ranks the tensor's content is unspecified afterwards
        check(tensor.tolist() == [float(world), float(sum(range(world)))], f"got {tensor.tolist()}")


if __name__ == "__main__":
    main(run)
