"""Non-blocking point-to-point: rank 0 posts one isend per peer, every peer an irecv; then wait.

python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/isend_irecv.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _common import check, main, need_ranks


def run(rank: int, world: int) -> None:
    need_ranks(world, 2, "isend_irecv")
    if rank == 0:
        tensors = [torch.full((2,), float(peer * 10)) for peer in range(world)]
        requests = [dist.isend(tensors[peer], dst=peer, tag=peer) for peer in range(1, world)]
        # the tensors must not be changed until their sends completed
        for request in requests:
            request.wait()
    else:
        got = torch.zeros(2)
        request = dist.irecv(got, src=0, tag=rank)
        request.wait()  # `got` is only valid after wait()
        check(got.tolist() == [rank * 10.0] * 2, f"received {got.tolist()}")


if __name__ == "__main__":
    main(run)
