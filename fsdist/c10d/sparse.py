"""Sparse (COO) all_reduce with SUM, as Gloo offers it (DDP uses it for sparse gradients).

No collective moves sparse tensors directly: every rank's index and value arrays are
all-gathered through the ordinary dense path (padded to the largest count, after an all-gather
of the counts), and each rank sums them locally in rank order and coalesces, so every rank ends
with the same tensor. Three ordinary operations, each with its own sequence number, so desync
detection covers them; the call completes before it returns, even when asked to be async.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .work import FsdistWork

__all__ = ["all_reduce_sparse", "sparse_work"]

#: all_gather(outputs, input) over the group, waited for: the adapter's own method.
Gather = Callable[[list[torch.Tensor], torch.Tensor], object]


def sparse_work(tensors: Sequence[torch.Tensor], op: Any, world: int, gather: Gather) -> FsdistWork:
    """``all_reduce_sparse`` as one operation's finished Work (its profiler event spanning the
    three all_gathers); an error is raised, and ends the event too."""
    work = FsdistWork(list(tensors), "all_reduce sparse")
    work.profile([])
    try:
        all_reduce_sparse(tensors, op, world, gather)
    except BaseException as error:
        work.complete(error)
        raise
    work.complete()
    return work


def all_reduce_sparse(tensors: Sequence[torch.Tensor], op: Any, world: int, gather: Gather) -> None:
    """Sum ``tensors[0]`` (sparse COO) over the group, in place."""
    if len(tensors) != 1:
        raise ValueError(f"sparse all_reduce: fsdist takes exactly one tensor per rank, got {len(tensors)}")
    if op != dist.ReduceOp.SUM:
        raise ValueError(f"sparse all_reduce supports ReduceOp.SUM only (as Gloo), not {op}")
    (tensor,) = tensors
    local = tensor.detach().cpu().coalesce()
    indices, values = local.indices(), local.values()
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    gather(counts, torch.tensor([indices.shape[1]], dtype=torch.int64))
    most = max(int(c.item()) for c in counts)
    padded_indices = indices.new_zeros((indices.shape[0], most))
    padded_indices[:, : indices.shape[1]] = indices
    padded_values = values.new_zeros((most, *values.shape[1:]))
    padded_values[: values.shape[0]] = values
    all_indices = [torch.empty_like(padded_indices) for _ in range(world)]
    all_values = [torch.empty_like(padded_values) for _ in range(world)]
    gather(all_indices, padded_indices)
    gather(all_values, padded_values)
    n = [int(c.item()) for c in counts]
    summed = torch.sparse_coo_tensor(
        torch.cat([i[:, :k] for i, k in zip(all_indices, n, strict=True)], dim=1),
        torch.cat([v[:k] for v, k in zip(all_values, n, strict=True)]),
        local.shape,
    ).coalesce()
    tensor.copy_(summed.to(tensor.device))
