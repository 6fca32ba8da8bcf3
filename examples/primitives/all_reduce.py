"""all_reduce with each reduce op: every rank ends with the same combination of all tensors.

python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/all_reduce.py
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from _common import check, main


def run(rank: int, world: int) -> None:
    x = float(rank + 1)  # rank r contributes r + 1
    ranks = range(1, world + 1)
    expected = {
        dist.ReduceOp.SUM: sum(ranks),
        dist.ReduceOp.PRODUCT: math.prod(ranks),
        dist.ReduceOp.MIN: 1,
        dist.ReduceOp.MAX: world,
        dist.ReduceOp.AVG: sum(ranks) / world,
    }
    for op, want in expected.items():
        t = torch.tensor([x])
        dist.all_reduce(t, op=op)
        check(t.item() == want, f"all_reduce {op}: got {t.item()}, expected {want}")

    # bitwise ops need integer (or bool) tensors: rank r contributes the bit 1 << r, plus bit 7
    bits = torch.tensor([(1 << rank) | 0x80])
    for op, want in [(dist.ReduceOp.BOR, (1 << world) - 1 | 0x80), (dist.ReduceOp.BAND, 0x80 | (world == 1))]:
        t = bits.clone()
        dist.all_reduce(t, op=op)
        check(t.item() == want, f"all_reduce {op}: got {t.item():#x}, expected {want:#x}")
    t = bits.clone()
    dist.all_reduce(t, op=dist.ReduceOp.BXOR)
    want = (1 << world) - 1 | (0x80 if world % 2 else 0)
    check(t.item() == want, f"all_reduce BXOR: got {t.item():#x}, expected {want:#x}")

    # PREMUL_SUM: every input multiplied by a factor, then summed (torch makes it privately)
    t = torch.tensor([x])
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    check(t.item() == sum(ranks) * 0.5, f"all_reduce PREMUL_SUM: got {t.item()}")


if __name__ == "__main__":
    main(run)
