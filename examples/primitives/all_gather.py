"""all_gather: every rank receives every rank's tensor, in rank order.

python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/all_gather.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _common import check, main


def run(rank: int, world: int) -> None:
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([rank * 7]))
    check([g.item() for g in gathered] == [r * 7 for r in range(world)], f"got {gathered}")
    # the same into one tensor (what FSDP uses): torch >= 2.13 also calls it all_gather_single,
    # and keeps this name, which every release has
    flat = torch.zeros(world, dtype=torch.int64)
    dist.all_gather_into_tensor(flat, torch.tensor([rank * 7]))
    check(flat.tolist() == [r * 7 for r in range(world)], f"got {flat.tolist()}")


if __name__ == "__main__":
    main(run)
