"""fsdist demo: 4 ranks, one temporary directory, no network. Collectives, then DDP training.

    python examples/demo.py [--ranks 4] [--steps 30] [--dir DIR]

Every rank is a real process; they find each other and exchange every byte through files in
the directory. The demo checks each result and exits non-zero if anything is wrong.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def collectives(rank: int, world: int) -> None:
    """One of each collective, checked against what it must produce."""
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2
    b = torch.tensor([7.0 if rank == 0 else 0.0])
    dist.broadcast(b, src=0)
    assert b.item() == 7.0
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    assert [g.item() for g in gathered] == list(range(world))
    out = torch.zeros(1)
    dist.reduce_scatter(out, [torch.tensor([float(rank)]) for _ in range(world)])
    assert out.item() == sum(range(world))
    if world > 1:
        dist.send(torch.tensor([float(rank)]), (rank + 1) % world)
        got = torch.zeros(1)
        dist.recv(got, (rank - 1) % world)
        assert got.item() == (rank - 1) % world
    dist.barrier()
    if rank == 0:
        print(f"[rank 0] all_reduce, broadcast, all_gather, reduce_scatter, send/recv, barrier: OK over {world} ranks")


def train(rank: int, world: int, steps: int) -> None:
    """A small MLP learns y = sin(x) with DDP; gradients are averaged through files."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank sees its own data
    start = time.perf_counter()
    for step in range(1, steps + 1):
        x = torch.rand(64, 1, generator=gen) * 6 - 3
        loss = torch.nn.functional.mse_loss(ddp(x), torch.sin(x))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 10 == 0 or step == steps):
            per_step_ms = (time.perf_counter() - start) / step * 1e3
            print(f"[rank 0] step {step:4d}  loss {loss.item():.4f}  ({per_step_ms:.1f} ms/step)")
    # DDP keeps replicas identical: check it through fsdist itself
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    replicas = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(replicas, flat)
    assert all(torch.equal(r, flat) for r in replicas), "replicas diverged"
    if rank == 0:
        print(f"[rank 0] DDP: {steps} steps, all {world} replicas identical")


def run_rank(rank: int, world: int, directory: str, steps: int) -> None:
    import fsdist  # noqa: F401 - registers the "fsdist" backend and the fsdist:// scheme

    dist.init_process_group(
        "fsdist", init_method=f"fsdist://{directory}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        collectives(rank, world)
        train(rank, world, steps)
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dir", help="shared directory (default: a new temporary one)")
    args = parser.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix="fsdist-demo-")
    print(f"fsdist demo: {args.ranks} ranks exchanging everything through {directory}")
    mp.spawn(run_rank, args=(args.ranks, directory, args.steps), nprocs=args.ranks)
    left = os.listdir(directory)
    print(f"done; the directory now holds {left or 'nothing'} (a finished job leaves only its empty rendezvous record)")
    if not args.dir:  # the demo's own temporary directory: gone with the demo
        shutil.rmtree(directory)
    python = os.path.relpath(sys.executable)
    python = sys.executable if python.startswith("..") else python
    print(
        "next, the launcher with this same Python (or `source .venv/bin/activate` first):\n"
        f"  {python} -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/train_ddp.py"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
