"""Blocking point-to-point: each rank sends its tensor to the next rank around a ring.

python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/send_recv.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _common import check, main, need_ranks


def run(rank: int, world: int) -> None:
    need_ranks(world, 2, "send_recv")
    mine = torch.full((3,), float(rank))
    got = torch.zeros(3)
    # fsdist's send is buffered (it never waits for the receiver), so every rank may send first
    dist.send(mine, dst=(rank + 1) % world)
    dist.recv(got, src=(rank - 1) % world)
    check(torch.equal(got, torch.full((3,), float((rank - 1) % world))), f"received {got.tolist()}")


if __name__ == "__main__":
    main(run)
