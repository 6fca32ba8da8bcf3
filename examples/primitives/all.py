"""Every primitive example in one job (what CI runs; one start-up instead of ten).

python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/all.py
"""

from __future__ import annotations

import importlib

import torch.distributed as dist

from _common import main

EXAMPLES = [
    "send_recv",
    "isend_irecv",
    "broadcast",
    "scatter",
    "gather",
    "all_gather",
    "reduce",
    "all_reduce",
    "barrier",
    "groups",
]


def run(rank: int, world: int) -> None:
    for name in EXAMPLES:
        importlib.import_module(name).run(rank, world)
        dist.barrier()
        if rank == 0:
            print(f"[rank 0] {name}: OK", flush=True)


if __name__ == "__main__":
    main(run)
