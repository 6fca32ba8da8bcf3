"""all_reduce: chooses its form by size and group, and runs the one-round and sliced forms.

The forms: one round where every rank reduces every input, or reduce-scatter + all-gather; for
small messages in groups of ROOTED_MIN_RANKS or more, through rank 0 (rooted.py), or from
ALLREDUCE_DOUBLING_MIN_RANKS on, recursive doubling (doubling.py).

One round (2 ranks, or messages < ALLREDUCE_SLICED_MIN_BYTES): every rank publishes its input
and reduces all N inputs in rank order, in place in its own tensor where the order allows.
Per rank: writes S, reads (N-1)·S. At N = 2 this moves fewer bytes than the sliced form
(S written instead of 1.5·S, S read either way) and saves a round trip.

Sliced (N ≥ 3, large): step 1, every rank publishes its input but for its own slice (writes
(N-1)·S/N: nobody else reads that slice); step 2, rank i reduces slice i of all inputs (reads
(N-1)·S/N) and publishes it (writes S/N); then every rank reads the N-1 other reduced slices
((N-1)·S/N). Per rank: writes S, reads 2·S·(N-1)/N, independent of N.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..defaults import (
    ALLREDUCE_DOUBLING_MIN_RANKS,
    ALLREDUCE_SLICED_MIN_BYTES,
    DOUBLING_MAX_BYTES,
    DOUBLING_MIN_RANKS,
    ROOTED_MIN_RANKS,
)
from ..transport.interfaces import CollectiveChannel
from ._common import read_part, reduce_into_own
from .doubling import all_reduce_doubling
from .reduce_ops import Reduction, finish
from .rooted import all_reduce_rooted

_SmallForm = Callable[[CollectiveChannel, Sequence[torch.Tensor], Reduction, int], None]


def small_form(size: int, nbytes: int) -> _SmallForm | None:
    """The form for a small all_reduce of ``nbytes`` in a group of ``size`` ranks, if it has one:
    through rank 0 up to ALLREDUCE_DOUBLING_MIN_RANKS ranks (rooted.py says why), else by
    doubling."""
    if nbytes > DOUBLING_MAX_BYTES or size < DOUBLING_MIN_RANKS:
        return None
    if ROOTED_MIN_RANKS <= size < ALLREDUCE_DOUBLING_MIN_RANKS:
        return all_reduce_rooted
    return all_reduce_doubling


def all_reduce(t: CollectiveChannel, tensor: torch.Tensor, reduction: Reduction, first_step: int = 1) -> None:
    """Reduce ``tensor`` over all ranks in place, publishing as steps ``first_step`` and the next."""
    if t.size == 1:
        finish(reduction, tensor, 1)
        return
    small = small_form(t.size, tensor.numel() * tensor.element_size())
    if small is not None:
        small(t, [tensor], reduction, first_step)
        return
    if t.size == 2 or tensor.numel() * tensor.element_size() < ALLREDUCE_SLICED_MIN_BYTES:
        t.publish(first_step, [tensor])
        reduce_into_own(t, first_step, 0, reduction, tensor)  # own input published: it takes the result
        finish(reduction, tensor, t.size)
        return
    flat = tensor.view(-1)
    bounds = slice_bounds(flat.numel(), t.size)
    lo, hi = bounds[t.rank]
    # step 1 leaves out this rank's own slice, which only this rank reduces: part 0 is what
    # comes before it, part 1 what comes after ((N-1)/N·S written instead of S)
    t.publish(first_step, [flat[:lo], flat[hi:]])
    mine = flat[lo:hi]  # nobody reads it from here on, so the reduced slice may land in it
    item = flat.element_size()

    def my_slice_in(peer: int) -> tuple[int, int]:
        """Where slice ``t.rank`` lies in ``peer``'s step-1 message: (part, byte offset)."""
        return (0, lo * item) if t.rank < peer else (1, (lo - bounds[peer][1]) * item)

    reduce_into_own(t, first_step, 0, reduction, mine, locate=my_slice_in)
    finish(reduction, mine, t.size)
    t.publish(first_step + 1, [mine])
    for rank, (start, stop) in enumerate(bounds):
        if rank != t.rank:
            read_part(t, rank, first_step + 1, 0, flat[start:stop])


def all_reduce_coalesced(t: CollectiveChannel, tensors: Sequence[torch.Tensor], reduction: Reduction) -> None:
    """Reduce several tensors in one operation; small ones (or 2 ranks) share one publish.

    Many small tensors (``allreduce_coalesced``, DDP's small buckets) would otherwise cost a
    file, a record write and a round trip each: here every rank publishes them all as parts
    of one message and reduces part by part. Otherwise each tensor is an all_reduce of its
    own, one after another, tensor k from step ``k·(2 + log2 P) + 1`` on (room for the sliced
    form's 2 steps, the rooted form's 2, or doubling's 2 + log2 P).
    """
    total = sum(x.numel() * x.element_size() for x in tensors)
    small = small_form(t.size, total)
    if small is not None and len(tensors) > 1:
        small(t, tensors, reduction, 1)
        return
    if t.size == 1 or len(tensors) == 1 or not (t.size == 2 or total < ALLREDUCE_SLICED_MIN_BYTES):
        stride = _steps_of_one(t.size)
        for index, tensor in enumerate(tensors):
            all_reduce(t, tensor, reduction, first_step=stride * index + 1)
        return
    t.publish(1, tensors)
    for part, tensor in enumerate(tensors):
        reduce_into_own(t, 1, part, reduction, tensor)
        finish(reduction, tensor, t.size)


def _steps_of_one(size: int) -> int:
    """Steps one all_reduce may use at this group size: 2 (sliced), or 2 + log2 P (doubling)."""
    return 2 + (size.bit_length() - 1)


def slice_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``parts`` contiguous ranges differing by at most one."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
