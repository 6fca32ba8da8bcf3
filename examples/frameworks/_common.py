"""What the framework examples share: their arguments, the tiny model and data, and the final check.

The Lightning and accelerate examples train a tiny regression model (8 → 16 → 1) on generated
data, the transformers one a tiny GPT-2; everything is seeded, so a run over fsdist and the same
run over Gloo must end with bit-identical parameters (2 ranks: a sum of two floats does not depend
on the order). ``finish`` checks on every rank that all
replicas are bit-identical, and with ``--save FILE`` rank 0 writes the final parameters for the
comparison with another backend (``tests/frameworks`` does it).
"""

from __future__ import annotations

import argparse
import gc
import os
import weakref

import torch
import torch.distributed as dist

BATCH = 8  # per rank


class WrongResultError(AssertionError):
    """The replicas differ, or training changed nothing."""


def check(condition: bool, what: str) -> None:
    """Like ``assert``, but not removed by ``python -O``."""
    if not condition:
        raise WrongResultError(f"rank {dist.get_rank()}: {what}")


def parse_args(doc: str | None, init_method: bool = True) -> argparse.Namespace:
    """The examples' flags; ``init_method=False`` where the framework itself creates the group."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="fsdist", help="process group backend (gloo: the same run on Gloo)")
    if init_method:
        parser.add_argument(
            "--init-method",
            default=None,
            help="init_process_group's init_method (default: env://, served through FSDIST_DIR under fsdist run)",
        )
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
    parser.add_argument("--save", help="rank 0 saves the final parameters to this file (torch.save)")
    return parser.parse_args()


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def make_data(world: int, steps: int) -> torch.utils.data.TensorDataset:
    """Exactly ``steps`` batches of ``BATCH`` samples for each of ``world`` ranks."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(world * steps * BATCH, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    return torch.utils.data.TensorDataset(x, y)


def world_size_from_env(default: int) -> int:
    return int(os.environ.get("WORLD_SIZE", default))


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def check_released(ddp: weakref.ref[torch.nn.Module]) -> None:
    """Call before ``destroy_process_group``: the DDP wrapper (and its reducer) must be gone.

    This matters for ``--backend gloo``. If DDP's reducer outlives ``destroy_process_group``, it
    is the Gloo group's last owner and destroys it when it dies, with the GIL held; the Gloo
    group's destructor joins its worker threads, and a worker that is freeing a finished work
    holding Python tensors waits for the GIL: both wait forever (torch issue 56297; seen here in
    the transformers and accelerate examples' Gloo runs at exit, on a loaded machine). Released
    by ``destroy_process_group`` instead, the group is destroyed without the GIL. fsdist's group
    has no worker threads of that kind; the check costs nothing.
    """
    gc.collect()  # frameworks keep reference cycles
    check(ddp() is None, "the DDP model is still alive before destroy_process_group")


def finish(name: str, model: torch.nn.Module, initial: torch.Tensor, args: argparse.Namespace) -> None:
    """Check that every rank holds bit-identical, trained parameters; rank 0 saves and reports."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = flat(model)
    check(not torch.equal(mine, initial), "training did not change the parameters")
    replicas = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(replicas, mine)
    for other, replica in enumerate(replicas):
        # compare bits, not values: -0.0 == 0.0 and NaN != NaN would both mislead
        check(torch.equal(replica.view(torch.int32), mine.view(torch.int32)), f"rank {other}'s parameters differ")
    if rank == 0:
        if args.save:
            torch.save({k: v.detach().clone() for k, v in model.named_parameters()}, args.save)
        print(
            f"[rank 0] {name}: {args.steps} steps on {world} ranks over {dist.get_backend()}; "
            f"replicas bitwise equal (sum of parameters {mine.double().sum().item():.10f})",
            flush=True,
        )
