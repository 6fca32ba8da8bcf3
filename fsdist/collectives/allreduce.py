"""all_reduce: one round for small tensors, reduce-scatter + all-gather through files for large.

Small (< ALLREDUCE_SLICED_MIN_BYTES): every rank publishes its input and reduces all inputs in
rank order. Per rank: writes S, reads (N-1)·S; one round trip.

Large: step 1, every rank publishes its input; step 2, rank i reduces slice i of all inputs
(reads (N-1)·S/N) and publishes it (writes S/N); then every rank reads the N-1 other reduced
slices ((N-1)·S/N). Per rank: writes S·(1+1/N), reads 2·S·(N-1)/N, independent of N.
"""

from __future__ import annotations

import torch

from ..defaults import ALLREDUCE_SLICED_MIN_BYTES
from ..reduce_ops import Reduction, finish
from ..transport import GroupTransport
from ._common import read_part, reduce_over_ranks


def all_reduce(t: GroupTransport, tensor: torch.Tensor, reduction: Reduction, first_step: int = 1) -> None:
    """Reduce ``tensor`` over all ranks in place, publishing as steps ``first_step`` and the next."""
    if t.size == 1:
        finish(reduction, tensor, 1)
        return
    t.publish(first_step, [tensor])
    if tensor.numel() * tensor.element_size() < ALLREDUCE_SLICED_MIN_BYTES:
        acc = torch.empty_like(tensor)
        reduce_over_ranks(t, first_step, 0, reduction, acc, tensor)
        finish(reduction, acc, t.size)
        tensor.copy_(acc)
        return
    flat = tensor.view(-1)
    bounds = slice_bounds(flat.numel(), t.size)
    lo, hi = bounds[t.rank]
    mine = torch.empty(hi - lo, dtype=flat.dtype)
    reduce_over_ranks(t, first_step, 0, reduction, mine, flat[lo:hi], byte_offset=lo * flat.element_size())
    finish(reduction, mine, t.size)
    t.publish(first_step + 1, [mine])
    for rank, (start, stop) in enumerate(bounds):
        if rank == t.rank:
            flat[start:stop].copy_(mine)
        else:
            read_part(t, rank, first_step + 1, 0, flat[start:stop])


def slice_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``parts`` contiguous ranges differing by at most one."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
