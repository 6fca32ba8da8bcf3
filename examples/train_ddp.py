"""Train a small MLP with DDP over fsdist. Start it with the port-free launcher:

    python -m fsdist run --nproc-per-node 4 --dir /shared/run examples/train_ddp.py --steps 50

The launcher sets RANK, WORLD_SIZE and FSDIST_DIR; torch's default init (env://) then meets
through that directory, so the script needs nothing fsdist-specific but the backend string.
Data is generated (a noisy sine), each rank drawing its own batches.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--fail-at-step", type=int, default=-1, help="rank 1 raises there (to try failure reports)")
    args = parser.parse_args()
    dist.init_process_group("fsdist")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(1, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(rank)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        if step == args.fail_at_step and rank == 1:
            raise RuntimeError(f"rank {rank} failed on purpose at step {step}")
        x = torch.rand(128, 1, generator=gen) * 6 - 3
        y = torch.sin(x) + 0.05 * torch.randn(128, 1, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            ms = (time.perf_counter() - start) / step * 1e3
            print(f"step {step:5d}/{args.steps}  loss {loss.item():.4f}  {ms:.1f} ms/step  ({world} ranks)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
