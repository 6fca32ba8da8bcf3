"""What every example shares: join the job the launcher started, run, check, leave.

Each example defines ``run(rank, world)``, which raises ``WrongResultError`` on a wrong result, and
ends with ``main(run)``. ``all.py`` runs every example's ``run`` in one job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch.distributed as dist


class WrongResultError(AssertionError):
    """An example computed something other than what the primitive must produce."""


def check(condition: bool, what: str) -> None:
    """Like ``assert``, but not removed by ``python -O``."""
    if not condition:
        raise WrongResultError(f"rank {dist.get_rank()}: {what}")


def need_ranks(world: int, least: int, name: str) -> None:
    if world < least:
        raise SystemExit(f"{name} needs at least {least} ranks (run it with --nproc-per-node {least} or more)")


def main(run: Callable[[int, int], None]) -> None:
    """Join the job (``fsdist run`` sets RANK, WORLD_SIZE and FSDIST_DIR), run, leave.

    torch's default init (env://) meets through FSDIST_DIR; installing fsdist registers the
    backend when torch is imported, so nothing here is fsdist's but the backend string."""
    dist.init_process_group("fsdist")
    try:
        run(dist.get_rank(), dist.get_world_size())
        if dist.get_rank() == 0:
            name = os.path.basename(sys.argv[0]).removesuffix(".py")
            print(f"[rank 0] {name}: OK on {dist.get_world_size()} ranks", flush=True)
    finally:
        dist.destroy_process_group()
