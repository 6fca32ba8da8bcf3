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
        deadline = time.monotonic() + timeout
        while not os.path.exists(release_file):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{release_file} never appeared")
            time.sleep(0.05)
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
