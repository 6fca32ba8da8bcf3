"""Cases for `fsdist status`: a job held up on purpose, and a job that crashed."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def straggle_before_all_reduce(straggler: int, release_file: str, timeout: float) -> float:
    """Every rank but ``straggler`` enters an all_reduce at once; ``straggler`` first waits
    until ``release_file`` exists (the test creates it once it has seen the others wait)."""
    dist.barrier()
    if dist.get_rank() == straggler:
        _wait_for(release_file, timeout)
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return t[0].item()


def crash_after_a_broadcast(directory: str, rank: int, world: int) -> None:
    """Join, run one collective, and die without leaving: what a crashed job leaves behind."""
    import fsdist  # noqa: F401

    dist.init_process_group("fsdist", init_method=f"fsdist://{directory}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    dist.broadcast(torch.arange(3), src=0)
    dist.barrier()
    os._exit(0)


def straggle_in_a_subgroup(straggler: int, release_file: str, timeout: float) -> float:
    """Even and odd ranks each all_reduce in their own subgroup, then meet in a world barrier;
    ``straggler`` (odd) holds its subgroup up, and through it the world."""
    world = dist.get_world_size()
    evens, odds = dist.new_group(list(range(0, world, 2))), dist.new_group(list(range(1, world, 2)))
    mine = evens if dist.get_rank() % 2 == 0 else odds
    if dist.get_rank() == straggler:
        _wait_for(release_file, timeout)
    t = torch.ones(2)
    dist.all_reduce(t, group=mine)
    dist.barrier()
    dist.destroy_process_group(evens)
    dist.destroy_process_group(odds)
    return t[0].item()


def _wait_for(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)
