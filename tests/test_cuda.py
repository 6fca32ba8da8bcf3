"""CUDA tensors are staged through host memory: every op works on them, results land on the GPU."""

from __future__ import annotations

import pytest
import torch

from harness import RankPool

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")


def cuda_ops() -> list[str]:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", 0)
    failures = []
    t = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    if t.device.type != "cuda" or t[0].item() != world * (world + 1) / 2:
        failures.append(f"all_reduce: {t.device} {t[0].item()}")
    b = torch.arange(10.0, device=dev) if rank == 0 else torch.zeros(10, device=dev)
    dist.broadcast(b, 0)
    if not torch.equal(b.cpu(), torch.arange(10.0)):
        failures.append("broadcast")
    out = torch.zeros(world * 3, device=dev)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=dev))
    if out.cpu().tolist() != [float(r) for r in range(world) for _ in range(3)]:
        failures.append(f"all_gather_into_tensor {out.cpu().tolist()}")
    rs = torch.zeros(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.ones(2 * world, device=dev))
    if rs.cpu().tolist() != [float(world)] * 2:
        failures.append("reduce_scatter_tensor")
    if world > 1:
        dist.send(torch.full((4,), float(rank), device=dev), (rank + 1) % world)
        got = torch.zeros(4, device=dev)
        dist.recv(got, (rank - 1) % world)
        if got.cpu().tolist() != [float((rank - 1) % world)] * 4:
            failures.append("send/recv")
    return failures


def test_cuda_tensors_are_staged_through_host_memory() -> None:
    pool = RankPool(2)
    try:
        results = pool.run(cuda_ops)
    finally:
        pool.close()
    assert results == [[], []]
