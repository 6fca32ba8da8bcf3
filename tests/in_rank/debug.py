"""Cases for the per-operation debug records (FSDIST_DEBUG=1, TORCH_DISTRIBUTED_DEBUG=DETAIL)."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def ops_with_records() -> list[dict[str, Any]]:
    """Run a few operations in a new subgroup and return the debug records they produced."""
    keep = _Keep()
    logging.getLogger("fsdist.ops").addHandler(keep)
    try:
        group = dist.new_group([0, 1])  # created now, so it sees the environment of this pool
        rank = dist.get_rank()
        t = torch.ones(1000)
        dist.all_reduce(t, group=group)
        dist.broadcast(torch.zeros(3, dtype=torch.int64), src=0, group=group)
        if rank == 0:
            dist.send(torch.ones(5), 1, group=group)
        else:
            dist.recv(torch.zeros(5), 0, group=group)
        dist.barrier(group=group)
        dist.destroy_process_group(group)
    finally:
        logging.getLogger("fsdist.ops").removeHandler(keep)
    fields = ("fsdist_rank", "fsdist_group", "fsdist_seq", "fsdist_op", "fsdist_bytes", "fsdist_seconds")
    return [{name: getattr(r, name) for name in fields} | {"message": r.getMessage()} for r in keep.records]


def debug_is_off() -> bool:
    """In a pool started without the debug variables, the world group decided not to log."""
    from torch.distributed.distributed_c10d import _get_default_group

    return _get_default_group()._ops.on is False
