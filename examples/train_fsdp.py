"""Train a small MLP with FSDP2 (``fully_shard``) over fsdist, and checkpoint it sharded.

    python -m fsdist run --nproc-per-node 4 --dir /shared/run examples/train_fsdp.py --steps 50 \\
        --checkpoint /shared/ckpt

Each rank holds 1/N of every parameter; forward all-gathers a layer's parameters, backward
reduce-scatters its gradients, all through the shared directory. With ``--checkpoint`` every rank
writes its own shards with ``torch.distributed.checkpoint`` and the run then reloads them into a
fresh model to show the round trip.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard


def sharded_model() -> torch.nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights, then keeps only its shard
    model = torch.nn.Sequential(
        torch.nn.Linear(1, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128), torch.nn.Tanh(), torch.nn.Linear(128, 1)
    )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--checkpoint", help="a directory on the shared filesystem for the sharded checkpoint")
    args = parser.parse_args()
    dist.init_process_group("fsdist")  # env://, served through the launcher's FSDIST_DIR
    rank, world = dist.get_rank(), dist.get_world_size()
    model = sharded_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(rank)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x = torch.rand(128, 1, generator=gen) * 6 - 3
        y = torch.sin(x) + 0.05 * torch.randn(128, 1, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            ms = (time.perf_counter() - start) / step * 1e3
            print(f"step {step:5d}/{args.steps}  loss {loss.item():.4f}  {ms:.1f} ms/step  ({world} ranks)", flush=True)
    if args.checkpoint:
        dcp.save({"model": model.state_dict()}, checkpoint_id=args.checkpoint)
        fresh = sharded_model()
        state = {"model": fresh.state_dict()}
        dcp.load(state, checkpoint_id=args.checkpoint)
        fresh.load_state_dict(state["model"])
        same = all(
            torch.equal(a.full_tensor(), b.full_tensor())
            for a, b in zip(model.parameters(), fresh.parameters(), strict=True)
        )
        if not same:
            raise RuntimeError("the reloaded checkpoint differs from the trained model")
        if rank == 0:
            print(f"checkpoint: saved to {args.checkpoint} and reloaded; every shard identical", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
