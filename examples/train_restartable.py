"""Train with DDP over fsdist, checkpoint with torch.distributed.checkpoint, resume after a restart.

    python -m fsdist run --nproc-per-node 2 --max-restarts 3 --dir /shared/run \\
        examples/train_restartable.py --steps 60 --checkpoint /shared/ckpt

Every ``--checkpoint-every`` steps the ranks save the model and optimizer state with DCP into
``CHECKPOINT/step-<n>/``; a run, first or restarted, resumes from the newest complete one (DCP
writes ``.metadata`` last, so a save cut short is never loaded). The batches of step n depend
only on the rank and n, so a resumed run repeats exactly what the interrupted one would have
done: its final parameters equal an uninterrupted run's, bit for bit. The script is written
for torchrun as much as for ``fsdist run``: both set TORCHELASTIC_RESTART_COUNT.

``--kill-rank R --kill-at-step S`` makes rank R kill itself with SIGKILL at step S, once (a
crash, to try restarts; ``CHECKPOINT/killed`` marks it done); ``--out`` saves rank 0's final
parameters.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel


def newest_checkpoint(root: str) -> tuple[int, str] | None:
    """The newest complete checkpoint under ``root``: (its step, its folder)."""
    if not os.path.isdir(root):
        return None
    steps = [
        int(name.removeprefix("step-"))
        for name in os.listdir(root)
        if name.startswith("step-") and os.path.exists(os.path.join(root, name, ".metadata"))
    ]
    return (max(steps), os.path.join(root, f"step-{max(steps):06d}")) if steps else None


def first_time(checkpoint: str) -> bool:
    """True the first time any rank asks (the mark is made exclusively: one rank, one round)."""
    try:
        os.close(os.open(os.path.join(checkpoint, "killed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.rand(64, 1, generator=gen) * 6 - 3
    return x, torch.sin(x) + 0.05 * torch.randn(64, 1, generator=gen)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint", required=True, help="a directory every rank shares")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-at-step", type=int, default=-1)
    parser.add_argument("--out", help="where rank 0 saves the final parameters (torch.save)")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep this long per step (a slow job)")
    args = parser.parse_args()
    dist.init_process_group("fsdist")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(args.checkpoint, exist_ok=True)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = 1
    found = newest_checkpoint(args.checkpoint)
    if found is not None:
        step, folder = found
        model_state, optim_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        first = step + 1
        if rank == 0:
            print(f"restart {restart}: resuming after step {step} from {folder}", flush=True)
    if rank == 0:
        print(f"restart {restart}: {world} ranks, from step {first}", flush=True)
    loss = torch.tensor(float("nan"))  # stays so when resuming from the last step's checkpoint
    for step in range(first, args.steps + 1):
        if rank == args.kill_rank and step == args.kill_at_step and first_time(args.checkpoint):
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(args.step_seconds)
        x, y = batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.checkpoint_every == 0 or step == args.steps:
            model_state, optim_state = get_state_dict(model, opt)
            folder = os.path.join(args.checkpoint, f"step-{step:06d}")
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
    if rank == 0:
        print(f"restart {restart}: trained to step {args.steps}, loss {loss.item():.4f}", flush=True)
        if args.out:
            torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
