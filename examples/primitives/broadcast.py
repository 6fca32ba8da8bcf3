"""broadcast: rank 0's tensor is copied into every rank's tensor.

python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/broadcast.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _common import check, main


def run(rank: int, world: int) -> None:
    tensor = torch.arange(4.0) if rank == 0 else torch.zeros(4)
    dist.broadcast(tensor, src=0)
    check(tensor.tolist() == [0.0, 1.0, 2.0, 3.0], f"got {tensor.tolist()}")


if __name__ == "__main__":
    main(run)
