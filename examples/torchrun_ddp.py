"""A DDP script written as for torchrun + Gloo: adopting fsdist changes the backend string only.

    torchrun --standalone --nproc-per-node 2 examples/torchrun_ddp.py             # torch's TCPStore
    python -m fsdist run --nproc-per-node 2 --dir /shared/run examples/torchrun_ddp.py   # no port
    torchrun --rdzv-backend=fsdist --rdzv-endpoint=/shared/run --rdzv-id=job1 \\
             --nnodes=1 --nproc-per-node=2 examples/torchrun_ddp.py                # no port
    ... examples/torchrun_ddp.py --backend gloo                                     # the same on Gloo

No ``import fsdist``: installing fsdist registers the backend when torch is imported. With no
init_method torch uses env://; fsdist meets through FSDIST_DIR where a launcher set it, and
otherwise accepts torch's TCPStore (all ranks on one machine: its files go to /dev/shm).
``--init-method file:///shared/dir/initfile`` takes torch's port-free file:// route instead.
Every rank prints a SHA-256 of its final parameters, so runs compare bit for bit. (torch 2.13's
Gloo sometimes aborts at exit, after the digests are printed: "terminate called without an
active exception", with or without fsdist installed; about one run in five here.)
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="fsdist")
    parser.add_argument("--init-method", default=None, help="default: env:// (torch's default)")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(args.backend, init_method=args.init_method, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x = torch.randn(16, 8, generator=gen)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    digests: list[str] = [""] * world
    dist.all_gather_object(digests, digest)
    assert len(set(digests)) == 1, f"replicas differ: {digests}"
    print(f"rank {rank}/{world} backend {dist.get_backend()} params {digest[:16]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
